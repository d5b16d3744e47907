"""ONNX entries for a GPU host, and the execution providers and session options the ``onnxruntime``
backend asks for.

The configs are the builders' own (``builders.context.onnx_entry_config``), handed to the backend's
provider choice as Triton hands them over (JSON with proto field names). Running on a real GPU with
onnxruntime-gpu is not tested here (no GPU on CI); the README says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.context import onnx_entry_config
from builders.families.efficientnet import EfficientNetLite0
from serving.backends.onnxruntime.ort_providers import (
    SPINNING,
    execution_providers,
    session_options,
    tensorrt_request,
)

GPU_RUNTIME = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


class _Input:
    def __init__(self, name: str, dims: tuple[int, ...]) -> None:
        self.name, self.dims = name, dims


def _as_triton_hands_it(config: mc.ModelConfig) -> dict:
    return json.loads(json_format.MessageToJson(config, preserving_proto_field_name=True))


def test_gpu_host_entries_get_gpu_instances_and_the_tensorrt_accelerator() -> None:
    spec = EfficientNetLite0()
    for precision, mode in (("fp32", "FP32"), ("fp16", "FP16")):
        config = onnx_entry_config(spec, f"m_{precision}", precision, gpu=True)
        assert [g.kind for g in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
        (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == mode
    int8 = onnx_entry_config(spec, "m_int8", "int8", gpu=True)
    assert [g.kind for g in int8.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
    assert not int8.optimization.execution_accelerators.gpu_execution_accelerator
    cpu = onnx_entry_config(spec, "m", "fp32", gpu=False)
    assert [g.kind for g in cpu.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
    assert not cpu.HasField("optimization")


def test_a_gpu_instance_asks_for_tensorrt_then_cuda_with_one_profile_for_every_batch() -> None:
    spec = EfficientNetLite0()
    config = _as_triton_hands_it(onnx_entry_config(spec, "m", "fp16", gpu=True))
    assert tensorrt_request(config) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": str(1 << 30),
    }
    inputs = [_Input("input", (3, 224, 224))]
    providers = execution_providers(config, inputs, "GPU", 1, GPU_RUNTIME)
    assert [p[0] if isinstance(p, tuple) else p for p in providers] == GPU_RUNTIME
    tensorrt, cuda = dict([providers[0]]), dict([providers[1]])
    options = tensorrt["TensorrtExecutionProvider"]
    assert options["device_id"] == "1" and options["trt_fp16_enable"] == "True"
    assert options["trt_profile_min_shapes"] == "input:1x3x224x224"
    assert options["trt_profile_max_shapes"] == f"input:{spec.batching.max_batch_size}x3x224x224"
    assert cuda["CUDAExecutionProvider"] == {"device_id": "1"}


def test_without_tensorrt_or_cuda_the_instance_falls_back() -> None:
    config = _as_triton_hands_it(onnx_entry_config(EfficientNetLite0(), "m", "fp32", gpu=True))
    inputs = [_Input("input", (3, 224, 224))]
    cuda_only = execution_providers(config, inputs, "GPU", 0, GPU_RUNTIME[1:])
    assert cuda_only == [("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"]
    assert execution_providers(config, inputs, "GPU", 0, ["CPUExecutionProvider"]) == [
        "CPUExecutionProvider"
    ]
    assert execution_providers(config, inputs, "CPU", 0, GPU_RUNTIME) == ["CPUExecutionProvider"]


def _parameter(config: dict) -> Callable[[str, str], str]:
    """``BatchingModel.parameter`` on ``config`` (``batching_core`` needs pb_utils, so it is not imported)."""
    return lambda key, default: (
        config.get("parameters", {}).get(key, {}).get("string_value") or default
    )


def test_idle_intra_op_threads_sleep_unless_the_config_asks_for_spinning() -> None:
    """Spinning idle threads starve Triton's batcher of its wake-up (500 ms stalls; README "Two instances
    per model"): a built entry's session must not spin, and only ``allow_spinning: "1"`` turns it on."""
    config = _as_triton_hands_it(onnx_entry_config(EfficientNetLite0(), "m", "fp32", gpu=False))
    options = session_options(_parameter(config))
    assert options.get_session_config_entry(SPINNING) == "0"
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (
        0,
        1,
    )  # the entry's parameters
    assert session_options(lambda key, default: default).get_session_config_entry(SPINNING) == "0"
    config["parameters"]["allow_spinning"] = {"string_value": "1"}
    assert session_options(_parameter(config)).get_session_config_entry(SPINNING) == "1"


def test_int8_kernels_saturate_on_x86_without_vnni() -> None:
    from serving.backends.onnxruntime.ort_providers import int8_kernels_saturate

    assert int8_kernels_saturate("x86_64", {"avx2", "fma"})  # AVX2 only: VPMADDUBSW sums into int16
    assert int8_kernels_saturate(
        "x86_64", {"avx2", "avx512f", "avx512bw"}
    )  # AVX-512 without VNNI: the same
    assert not int8_kernels_saturate("x86_64", {"avx2", "avx512_vnni"})
    assert not int8_kernels_saturate("x86_64", {"avx2", "avx_vnni"})
    assert int8_kernels_saturate("x86_64", set())  # features unknown: take the safe path
    assert not int8_kernels_saturate("aarch64", set())


def test_saturating_hosts_run_qdq_graphs_as_float_math() -> None:
    """The session option is one onnxruntime knows: on such a host a Q/DQ graph's answer is the float
    simulation of its INT8 math (checked against numpy's), not the saturated one."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from serving.backends.onnxruntime.ort_providers import DISABLE_QDQ_FUSION

    # y = MatMul(DQ(Q(x)), DQ(W)) with u8 activations near 255 and s8 weights near 127: every pair of
    # products sums past int16 (2 * 255 * 127 > 32767) in a VPMADDUBSW kernel.
    weights = np.full((64, 4), 127, dtype=np.int8)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
            helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
            helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [
            numpy_helper.from_array(np.array(1.0, np.float32), "xs"),
            numpy_helper.from_array(np.array(0, np.uint8), "xz"),
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.array(1.0, np.float32), "ws"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.add_session_config_entry(DISABLE_QDQ_FUSION, "1")
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    x = np.full((1, 64), 255.0, dtype=np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x @ weights.astype(np.float32))
    onnx.checker.check_model(model)
