"""A tiny, fast model repository for the gateway's integration tests.

The lead's ``model_repository`` fixture builds the real image models (slow to build and to run on
two CPU cores). The gateway's own behaviour (auth, limits, errors, stats) only needs models that
answer in about a millisecond, so this module writes:

- ``tiny_linear`` (``onnxruntime_onnx``): ``input`` FP32 [N,4] -> ``output`` FP32 [N,2],
  dynamic batching, max_batch_size 8, a real ONNX graph served through the onnxruntime shim.
- ``slow_echo`` (Python backend): ``DELAY_MS`` INT32 [1] -> ``OUT`` INT32 [1], sleeps first, so
  upstream timeouts and the in-flight bound can be exercised without timing assertions. A
  ``DELAY_MS`` of -N with N >= 1000 holds its instance until :func:`release_slow` (N) is called, so a
  test can fill the instances and know it did (a small negative delay still fails inside the model).
  It logs every request it runs (its ``DELAY_MS``, in order) to ``slow_echo/executed.txt``
  (:func:`slow_executions`), so a test can tell work that ran from work Triton dropped, and in which
  order queued requests were served.

Configs are written through Triton's own protobuf schema, as the design notes ask, with the same
priority levels and queue policies the builders give every model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

from builders.triton_config import apply_queue_policy
from serving.limits import DEFAULT_LIMITS

__all__ = [
    "TINY_MODEL",
    "SLOW_MODEL",
    "TINY_WEIGHT",
    "TINY_BIAS",
    "build_tiny_repository",
    "release_slow",
    "slow_executions",
]

TINY_MODEL = "tiny_linear"
SLOW_MODEL = "slow_echo"
TINY_WEIGHT = np.arange(8, dtype=np.float32).reshape(4, 2) / 10.0
TINY_BIAS = np.array([1.0, -1.0], dtype=np.float32)

_SLOW_MODEL_PY = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            value = int(delay.reshape(-1)[0])
            with open(os.path.join(self.folder, "executed.txt"), "a") as counter:
                counter.write(f"{value}\\n")
            if value <= -1000:  # held until the test releases it (bounded, so a failed test frees it too)
                release = os.path.join(self.folder, f"release{-value}")
                deadline = time.monotonic() + 120
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
            else:
                time.sleep(value / 1000.0)
            out = pb_utils.Tensor("OUT", delay.astype(np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def _write_config(path: Path, config: mc.ModelConfig) -> None:
    path.write_text(text_format.MessageToString(config))


def _tiny_onnx(path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "B"], ["output"]),
        ],
        "tiny_linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 2])],
        initializer=[
            numpy_helper.from_array(TINY_WEIGHT, "W"),
            numpy_helper.from_array(TINY_BIAS, "B"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build_tiny_repository(root: Path) -> Path:
    """Write the tiny repository under ``root`` and return it.

    Args:
        root: an empty (or missing) directory.

    Returns:
        ``root``, ready to hand to :class:`serving.launcher.TritonServer`.
    """
    tiny = root / TINY_MODEL
    (tiny / "1").mkdir(parents=True, exist_ok=True)
    _tiny_onnx(tiny / "1" / "model.onnx")
    config = mc.ModelConfig(name=TINY_MODEL, platform="onnxruntime_onnx", max_batch_size=8)
    config.input.add(name="input", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="output", data_type=mc.TYPE_FP32, dims=[2])
    # As the builders configure a model (serving.limits.QueueLimits.default_instances says why).
    config.instance_group.add(
        count=DEFAULT_LIMITS.queue.default_instances, kind=mc.ModelInstanceGroup.KIND_CPU
    )
    config.dynamic_batching.max_queue_delay_microseconds = 100
    for key in ("intra_op_thread_count", "inter_op_thread_count"):
        config.parameters[key].string_value = "1"
    _write_config(tiny / "config.pbtxt", apply_queue_policy(config))

    slow = root / SLOW_MODEL
    (slow / "1").mkdir(parents=True, exist_ok=True)
    (slow / "1" / "model.py").write_text(_SLOW_MODEL_PY)
    config = mc.ModelConfig(name=SLOW_MODEL, backend="python", max_batch_size=0)
    config.input.add(name="DELAY_MS", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="OUT", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(count=2, kind=mc.ModelInstanceGroup.KIND_CPU)
    _write_config(slow / "config.pbtxt", apply_queue_policy(config))
    return root


def slow_executions(root: Path) -> list[int]:
    """The ``DELAY_MS`` of every request ``slow_echo`` has run (in order), from its counter file."""
    counter = root / SLOW_MODEL / "executed.txt"
    return [int(line) for line in counter.read_text().split()] if counter.exists() else []


def release_slow(root: Path, hold: int) -> None:
    """Let the ``slow_echo`` request sent with ``DELAY_MS = -hold`` (``hold`` >= 1000) finish."""
    (root / SLOW_MODEL / f"release{hold}").touch()
