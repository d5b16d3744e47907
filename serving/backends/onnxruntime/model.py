"""A Python-based Triton backend named ``onnxruntime``.

The Triton binary that ships in the ``nvidia-pytriton`` wheel carries only the Python backend. Triton
treats a folder ``backends/<name>/model.py`` as a backend called ``<name>``, so this file makes
``platform: "onnxruntime_onnx"`` model configs load unchanged on the embedded server, while the NGC
container serves the very same repository with its native ONNX Runtime backend.

Batching, request validation and per-request errors are the shared core's (``batching_core.py``,
copied beside this file); what is ONNX Runtime's lives here and in ``ort_providers.py`` (also copied
beside it, and testable without Triton):

- Session options (``ort_providers.session_options``): thread counts come from the config parameters
  ``intra_op_thread_count`` and ``inter_op_thread_count``, the keys the native backend reads (0: every
  core, per instance). The intra-op pool's threads sleep when idle instead of spinning (parameter
  ``allow_spinning``: ``"1"`` spins, onnxruntime's own default): with spinning, instances
  oversubscribe the cores and starve Triton's own threads.
- Execution providers: a ``KIND_CPU`` instance runs on the CPU provider. A ``KIND_GPU`` instance runs
  on onnxruntime-gpu's CUDA provider (the ``gpu`` extra), preceded by the TensorRT provider when the
  config asks for it the way the native backend reads it
  (``optimization { execution_accelerators { gpu_execution_accelerator: [{ name: "tensorrt" }] } }``)
  and onnxruntime has it. The provider each model got is written to Triton's log; without a CUDA
  provider a ``KIND_GPU`` instance falls back to the CPU and says so there.
- On an x86-64 CPU without VNNI, INT8 (Q/DQ) graphs run as float math: onnxruntime's fused INT8
  kernels saturate there (``ort_providers.int8_kernels_saturate``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnxruntime as ort

if TYPE_CHECKING:
    from serving.backends.batching_core import BatchingModel
    from serving.backends.onnxruntime.ort_providers import (
        avoid_saturating_int8,
        execution_providers,
        session_options,
        tensorrt_request,
    )
else:  # Triton imports this file with its folder (holding copies of both modules) on sys.path
    from batching_core import BatchingModel
    from ort_providers import (
        avoid_saturating_int8,
        execution_providers,
        session_options,
        tensorrt_request,
    )


class TritonPythonModel(BatchingModel):
    """One ONNX Runtime session per model instance."""

    backend = "onnxruntime"

    def load(self, args: dict[str, str]) -> None:
        filename = self.config.get("default_model_filename") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        options = session_options(self.parameter)  # threads, and idle threads that sleep (not spin)
        if avoid_saturating_int8(options):
            self.log(
                "info",
                "this CPU has no VNNI: INT8 (Q/DQ) graphs run as float math, since onnxruntime's "
                "fused INT8 kernels saturate here",
            )
        kind = args.get("model_instance_kind", "CPU")
        available = ort.get_available_providers()
        providers = execution_providers(
            self.config,
            self.inputs,
            kind,
            int(args.get("model_instance_device_id") or 0),
            available,
        )
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        self.input_names = [t.name for t in self.inputs]
        self.output_names = [t.name for t in self.outputs]
        got = self.session.get_providers()
        self.log("info", f"instance kind {kind}: execution providers {', '.join(got)}")
        if kind.upper() == "GPU" and "CUDAExecutionProvider" not in got:
            self.log(
                "warn",
                "KIND_GPU instance is running on the CPU: this onnxruntime has no usable CUDA "
                f"provider (available: {', '.join(available)}); install the 'gpu' extra "
                "(onnxruntime-gpu) with a matching CUDA runtime",
            )
        elif tensorrt_request(self.config) is not None and "TensorrtExecutionProvider" not in got:
            self.log(
                "warn",
                "the config asks for the TensorRT accelerator, which this onnxruntime cannot use",
            )

    def run(self, inputs: list[Any]) -> Sequence[Any]:
        return self.session.run(self.output_names, dict(zip(self.input_names, inputs, strict=True)))


__all__ = ["TritonPythonModel"]
