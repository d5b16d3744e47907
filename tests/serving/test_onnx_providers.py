"""ONNX entries for a GPU host, and the execution providers the ``onnxruntime`` backend asks for.

The configs are the builders' own (``builders.context.onnx_entry_config``), handed to the backend's
provider choice as Triton hands them over (JSON with proto field names). Running on a real GPU with
onnxruntime-gpu is not tested here (no GPU on CI); the README says so.
"""

from __future__ import annotations

import json

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.context import onnx_entry_config
from builders.families.efficientnet import EfficientNetLite0
from serving.backends.onnxruntime.ort_providers import execution_providers, tensorrt_request

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
    assert tensorrt_request(config) == {"precision_mode": "FP16", "max_workspace_size_bytes": str(1 << 30)}
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
    assert execution_providers(config, inputs, "GPU", 0, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert execution_providers(config, inputs, "CPU", 0, GPU_RUNTIME) == ["CPUExecutionProvider"]
