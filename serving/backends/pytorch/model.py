"""A Python-based Triton backend named ``pytorch``: TorchScript or a compiled flavour, on CUDA or CPU.

Triton maps ``platform: "pytorch_libtorch"`` to the backend ``pytorch``. The NGC container has a
native libtorch backend of that name; the embedded server (nvidia-pytriton wheel, Python backend
only) finds this file as ``backends/pytorch/model.py`` instead, so one repository entry
(``<model>/config.pbtxt`` + ``<model>/<version>/model.pt``) loads unchanged on both. The compiled
flavours that ``builders/compiled.py`` makes are served here only: ``exported.pt2`` (a
``torch.export`` program that ``torch.compile`` compiles at load) and ``model.pt2`` (an
AOTInductor package); ``default_model_filename`` names the file.

Conventions shared with the native backend:
- Tensor names follow libtorch's ``<name>__<index>`` rule: ``INPUT__0, INPUT__1 ...`` are the
  positional arguments of ``forward`` in that order, ``OUTPUT__0, OUTPUT__1 ...`` the elements of
  the returned tuple (or the single returned tensor). Any other names are taken in config order.
- ``instance_group { kind: KIND_GPU }`` runs on the instance's GPU when CUDA is available;
  ``KIND_CPU`` (or no CUDA) runs on the CPU.

Batching, request validation and per-request errors are the shared core's (``batching_core.py``,
copied beside this file); what is PyTorch's lives here, in ``torch_module.py`` (loading
the module) and in ``batch_runner.py`` (running it on whole batches):

- Tensors cross the backend boundary by DLPack in both directions, never through numpy: the Python
  stub of the embedded Triton 2.51 (pybind11 2.10) reads numpy 2's dtype descriptors wrongly, so
  under numpy 2 ``as_numpy()`` returns wrong values (reproduced with numpy 2.4: ``[1, 2, 3, 4]``
  arrived as ``[1, 1, 1, 1]``) and numpy outputs are sent as zero bytes. DLPack is right under both.
- Inputs arrive on the host (HTTP, gRPC, system shared memory) or on the GPU (CUDA shared memory;
  the builders set ``FORCE_CPU_ONLY_INPUT_TENSORS: "no"`` on GPU entries so they stay there). On
  CUDA a batch is gathered by :class:`batch_runner.BatchRunner`: one pinned staging buffer, one
  host->device copy per batch, FP16 and channels_last inside the model's CUDA graph, the batch
  padded to the next size captured at load. Outputs return in one device->host copy per batch
  (``output_memory: "cpu"``, the default) or stay on the GPU (``"gpu"``) for a next step there.

Parameters (``parameters { key: ... value { string_value: ... } }``): ``precision`` (``fp16``, the
GPU default, or ``fp32``), ``device`` (``auto`` | ``cpu`` | ``cuda``: overrides the instance kind),
``channels_last`` and ``cuda_graphs`` (``true`` by default on CUDA), ``batch_sizes`` (the sizes to
capture, comma separated; default :data:`batch_runner.DEFAULT_CAPTURE_SIZES` and the preferred batch
sizes up to ``max_batch_size``), ``output_memory``, ``cudnn_benchmark`` (``false``),
``intra_op_thread_count`` (ATen's CPU threads; 0 = the instance's share of the cores on the CPU,
1 on CUDA, where the host only moves bytes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

if TYPE_CHECKING:
    from serving.backends.batching_core import BatchingModel, TensorConfig
    from serving.backends.pytorch.batch_runner import (
        BatchRunner,
        InputSpec,
        capture_sizes,
        host_cat,
    )
    from serving.backends.pytorch.torch_module import TorchModule, cpu_share
else:  # Triton imports this file with its folder (holding these modules) on sys.path
    from batch_runner import BatchRunner, InputSpec, capture_sizes, host_cat
    from batching_core import BatchingModel, TensorConfig
    from torch_module import TorchModule, cpu_share

_TORCH_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float32",
        "float16",
        "float64",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
    )
}


def _suffix_index(tensor: TensorConfig) -> int | None:
    _, sep, tail = tensor.name.rpartition("__")
    return int(tail) if sep and tail.isdigit() else None


class _Parts(list):  # type: ignore[type-arg]
    """One input's per-request tensors, not yet concatenated: the runner gathers them into its
    pinned staging buffer (host parts) or straight into the device batch (device parts)."""


class TritonPythonModel(BatchingModel):
    """One module per model instance, run on whole batches."""

    backend = "pytorch"

    def order(self, tensors: list[TensorConfig]) -> list[TensorConfig]:
        """Positional order: by the ``__<index>`` suffix where every name has one, else config order."""
        if tensors and all(_suffix_index(t) is not None for t in tensors):
            return sorted(tensors, key=lambda t: _suffix_index(t) or 0)
        return tensors

    def flag(self, key: str, default: bool) -> bool:
        return self.parameter(key, "true" if default else "false").strip().lower() in (
            "1",
            "true",
            "yes",
            "on",
        )

    def load(self, args: dict[str, str]) -> None:
        filename = self.config.get("default_model_filename") or "model.pt"
        path = os.path.join(args["model_repository"], args["model_version"], filename)

        wanted = self.parameter("device", "auto").lower()
        gpu_kind = args.get("model_instance_kind", "CPU").upper() == "GPU"
        if wanted == "cuda" and not torch.cuda.is_available():
            raise pb_utils.TritonModelException("parameter device=cuda, but CUDA is not available")
        use_cuda = torch.cuda.is_available() and (
            wanted == "cuda" or (wanted == "auto" and gpu_kind)
        )
        if use_cuda:
            self.device = torch.device("cuda", int(args.get("model_instance_device_id", "0") or 0))
            torch.cuda.set_device(self.device)
            # Off by default: without fixed batch sizes cuDNN re-tunes for every new shape (measured on
            # the H200: hundreds of ms per shape). The runner's sizes all run once at load.
            torch.backends.cudnn.benchmark = self.flag("cudnn_benchmark", False)
        else:
            self.device = torch.device("cpu")
        threads = int(self.parameter("intra_op_thread_count", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        elif use_cuda:
            # On the GPU the host only moves bytes and launches work: ATen's OpenMP threads would
            # only add barriers that wait for descheduled threads on a busy host (see batch_runner).
            torch.set_num_threads(1)
        else:  # this instance's share of the cores, not every core (see cpu_share)
            torch.set_num_threads(cpu_share(self.config))

        precision = self.parameter("precision", "fp16" if use_cuda else "fp32").lower()
        if precision not in ("fp16", "fp32"):
            raise pb_utils.TritonModelException(
                f"parameter precision={precision!r}: expected fp16 or fp32"
            )
        # FP16 only where it is fast: CPU half-precision convolutions are slow or missing.
        compute_dtype = torch.float16 if precision == "fp16" and use_cuda else torch.float32
        self.output_memory = self.parameter("output_memory", "cpu").lower()
        if self.output_memory not in ("cpu", "gpu"):
            raise pb_utils.TritonModelException(
                f"parameter output_memory={self.output_memory!r}: expected cpu or gpu"
            )
        self.model = TorchModule(
            path,
            self.device,
            compute_dtype,
            use_cuda and self.flag("channels_last", True),
            [_TORCH_DTYPES[t.dtype.name] for t in self.outputs],
            compile_threads=1,
        )

        self.runner: BatchRunner | None = None
        max_batch = int(self.config.get("max_batch_size", 0))
        if self.batched and all(-1 not in t.dims for t in self.inputs):
            listed = [int(s) for s in self.parameter("batch_sizes", "").split(",") if s.strip()]
            preferred = [
                int(s)
                for s in self.config.get("dynamic_batching", {}).get("preferred_batch_size", [])
            ]
            sizes = (
                capture_sizes(max_batch, sizes=listed)
                if listed
                else capture_sizes(max_batch, preferred)
            )
            specs = [InputSpec(t.dims, _TORCH_DTYPES[t.dtype.name]) for t in self.inputs]
            self.runner = BatchRunner(
                self.model,
                specs,
                self.device,
                sizes if use_cuda else (max_batch,),
                cuda_graphs=use_cuda and self.flag("cuda_graphs", True),
            )
            if self.runner.capture_error:
                self.log(
                    "warn",
                    f"CUDA graph capture failed, running eagerly: {self.runner.capture_error}",
                )
            if use_cuda:
                self.log(
                    "info",
                    f"{'CUDA graphs' if self.runner.cuda_graphs else 'eager'} at batch sizes {list(sizes)}",
                )
            else:  # the CPU runs exact batches: compile for all of them now
                self.model.warm(specs, sizes)

    # Hooks of the batching core: torch tensors, through DLPack, never numpy.

    def to_array(self, tensor: Any, spec: TensorConfig) -> torch.Tensor:
        return torch.utils.dlpack.from_dlpack(tensor.to_dlpack())

    def concatenate(self, parts: list[Any]) -> Any:
        return _Parts(parts)

    def pad(self, array: Any, length: int) -> Any:
        """A ragged input (a torch tensor, on the host or the GPU) zero-padded along axis 1 to ``length``."""
        if array.shape[1] == length:
            return array
        widths = [0, 0] * (array.dim() - 2) + [
            0,
            length - array.shape[1],
        ]  # last axis first, as F.pad takes them
        return torch.nn.functional.pad(array, widths)

    def to_tensor(self, spec: TensorConfig, value: Any) -> Any:
        return pb_utils.Tensor.from_dlpack(
            spec.name, torch.utils.dlpack.to_dlpack(value.contiguous())
        )

    def run(self, inputs: list[Any]) -> Sequence[Any]:
        # One request: its tensors; a merged batch: per input, the requests' tensors (see _Parts).
        merged = bool(inputs) and isinstance(inputs[0], _Parts)
        parts = [list(p) for p in zip(*inputs, strict=True)] if merged else [list(inputs)]
        if self.runner is not None:  # queued only: wait() waits for the device
            outputs = self.runner.run_parts(parts)
            if self.output_memory == "gpu":
                return self.runner.to_device(outputs, wait=False)
            return self.runner.to_host(outputs, wait=False)
        # Dynamic non-batch axes (or no batching): one eager run on the merged batch.
        with torch.inference_mode():
            tensors = [
                host_cat([p[i] for p in parts])
                if not any(p[i].is_cuda for p in parts)
                else torch.cat([p[i].to(self.device) for p in parts])
                for i in range(len(self.inputs))
            ]
            outputs = list(self.model(*(t.to(self.device, non_blocking=True) for t in tensors)))
        if self.device.type == "cuda" and self.output_memory == "cpu":
            outputs = [o.to("cpu") for o in outputs]
        return outputs

    def wait(self, outputs: Sequence[Any]) -> Sequence[Any]:
        if self.runner is not None:
            self.runner.synchronize()
        return outputs

    def finalize(self) -> None:
        self.runner = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
