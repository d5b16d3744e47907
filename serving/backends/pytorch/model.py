"""A Python-based Triton backend named ``pytorch``: TorchScript on CUDA (FP16) or CPU (FP32).

Triton maps ``platform: "pytorch_libtorch"`` to the backend ``pytorch``. The NGC container has a
native libtorch backend of that name; the embedded server (nvidia-pytriton wheel, Python backend
only) finds this file as ``backends/pytorch/model.py`` instead, so one repository entry
(``<model>/config.pbtxt`` + ``<model>/<version>/model.pt``) loads unchanged on both.

Conventions shared with the native backend:
- Tensor names follow libtorch's ``<name>__<index>`` rule: ``INPUT__0, INPUT__1 ...`` are the
  positional arguments of ``forward`` in that order, ``OUTPUT__0, OUTPUT__1 ...`` the elements of
  the returned tuple (or the single returned tensor). Any other names are taken in config order.
- ``instance_group { kind: KIND_GPU }`` runs on the instance's GPU when CUDA is available;
  ``KIND_CPU`` (or no CUDA) runs on the CPU.

Behaviour:
- Real batching: the dynamic batcher hands ``execute()`` several requests; their inputs are
  concatenated along the batch axis, the module runs once, and the outputs are split back.
- A bad request inside a batch fails alone; the others are still answered.
- Precision: on CUDA the module and floating inputs are cast to FP16 (config parameter
  ``precision``: ``fp16`` (default on GPU) or ``fp32``); on the CPU it stays FP32. Outputs are cast
  back to the dtype the config declares, so clients see the same tensors either way.
- Parameters (``parameters { key: ... value { string_value: ... } }``): ``precision``,
  ``device`` (``auto`` | ``cpu`` | ``cuda``: overrides the instance kind), ``intra_op_thread_count``
  (CPU threads for this instance, 0 = PyTorch's default), ``cudnn_benchmark`` (``false`` by
  default; ``true`` tunes cuDNN for every batch size 1..max_batch_size at load).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

_TRITON_TO_NUMPY = {
    "TYPE_FP32": np.float32,
    "TYPE_FP16": np.float16,
    "TYPE_FP64": np.float64,
    "TYPE_INT64": np.int64,
    "TYPE_INT32": np.int32,
    "TYPE_INT8": np.int8,
    "TYPE_UINT8": np.uint8,
    "TYPE_BOOL": np.bool_,
}


_TORCH_DTYPES = {
    np.float32: torch.float32,
    np.float16: torch.float16,
    np.float64: torch.float64,
    np.int64: torch.int64,
    np.int32: torch.int32,
    np.int8: torch.int8,
    np.uint8: torch.uint8,
    np.bool_: torch.bool,
}


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    raw = config.get("parameters", {}).get(key, {}).get("string_value")
    return raw if raw not in (None, "") else default


def _ordered(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Config tensors in positional order: by the ``__<index>`` suffix where every name has one."""
    def index(entry: dict[str, Any]) -> int | None:
        _, sep, tail = entry["name"].rpartition("__")
        return int(tail) if sep and tail.isdigit() else None

    if all(index(e) is not None for e in entries):
        return sorted(entries, key=lambda e: index(e))  # type: ignore[arg-type, return-value]
    return list(entries)


class TritonPythonModel:
    """One TorchScript module per model instance."""

    def initialize(self, args: dict[str, str]) -> None:
        self.config = json.loads(args["model_config"])
        filename = self.config.get("default_model_filename") or "model.pt"
        path = os.path.join(args["model_repository"], args["model_version"], filename)

        wanted = _parameter(self.config, "device", "auto").lower()
        gpu_kind = args.get("model_instance_kind", "CPU").upper() == "GPU"
        self.cudnn_benchmark = False
        use_cuda = torch.cuda.is_available() and (wanted == "cuda" or (wanted == "auto" and gpu_kind))
        if wanted == "cuda" and not torch.cuda.is_available():
            raise pb_utils.TritonModelException("parameter device=cuda, but CUDA is not available")
        if use_cuda:
            device_id = int(args.get("model_instance_device_id", "0") or 0)
            self.device = torch.device("cuda", device_id)
            torch.cuda.set_device(self.device)
            # Off by default: in benchmark mode cuDNN re-tunes for every new input shape, and the
            # dynamic batcher produces up to max_batch_size shapes; measured on the H200, each new
            # shape stalled the instance for hundreds of ms (P99 of seconds) until all were seen.
            # When switched on, every batch size is tuned once at load instead (see _warm_up).
            self.cudnn_benchmark = _parameter(self.config, "cudnn_benchmark", "false").lower() == "true"
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
        else:
            self.device = torch.device("cpu")
            threads = int(_parameter(self.config, "intra_op_thread_count", "0"))
            if threads > 0:
                torch.set_num_threads(threads)

        precision = _parameter(self.config, "precision", "fp16" if use_cuda else "fp32").lower()
        if precision not in ("fp16", "fp32"):
            raise pb_utils.TritonModelException(f"parameter precision={precision!r}: expected fp16 or fp32")
        # FP16 only where it is fast: CPU half-precision convolutions are slow or missing.
        self.compute_dtype = torch.float16 if precision == "fp16" and use_cuda else torch.float32

        self.module = torch.jit.load(path, map_location=self.device).eval()
        if self.compute_dtype == torch.float16:
            self.module = self.module.half()
        self.batched = int(self.config.get("max_batch_size", 0)) > 0
        self.inputs = [
            (i["name"], _TRITON_TO_NUMPY[i["data_type"]], [int(d) for d in i["dims"]])
            for i in _ordered(self.config["input"])
        ]
        self.outputs = [(o["name"], _TRITON_TO_NUMPY[o["data_type"]]) for o in _ordered(self.config["output"])]
        if self.device.type == "cuda":
            self._warm_up(int(self.config.get("max_batch_size", 0)))

    def _warm_up(self, max_batch_size: int) -> None:
        """Run every batch size once on the GPU, so per-shape costs (cuDNN tuning, allocator growth)
        are paid at load, not under traffic."""
        if any(-1 in dims for _, _, dims in self.inputs):
            return  # dynamic dims: the shapes to tune for are not known in advance
        for batch in range(1, max(max_batch_size, 1) + 1):
            arrays = [np.zeros(([batch] if self.batched else []) + dims, dtype=dtype) for _, dtype, dims in self.inputs]
            self._forward(arrays)
        torch.cuda.synchronize(self.device)

    def _check(self, name: str, dtype: type, dims: list[int], array: np.ndarray) -> None:
        if array.dtype != dtype:
            raise ValueError(f"input '{name}' has dtype {array.dtype}, expected {np.dtype(dtype)}")
        shape = list(array.shape[1:] if self.batched else array.shape)
        if self.batched and array.shape[0] == 0:
            raise ValueError(f"input '{name}' has an empty batch")
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape, strict=False)):
            raise ValueError(f"input '{name}' has shape {list(array.shape)}, expected [batch]+{dims}")

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        good: list[tuple[int, list[np.ndarray]]] = []
        for index, request in enumerate(requests):
            try:
                arrays = []
                for name, dtype, dims in self.inputs:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is None:
                        raise ValueError(f"missing input '{name}'")
                    array = tensor.as_numpy()
                    self._check(name, dtype, dims, array)
                    arrays.append(array)
                good.append((index, arrays))
            except ValueError as exc:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                )
        if good:
            self._run_batch(good, responses)
        return responses

    def _forward(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        tensors = []
        for array in arrays:
            tensor = torch.from_numpy(array).to(self.device, non_blocking=True)
            if tensor.is_floating_point():
                tensor = tensor.to(self.compute_dtype)
            tensors.append(tensor)
        # The profiling executor re-specialises (and re-fuses) the graph for every new input shape;
        # the dynamic batcher makes up to max_batch_size shapes, and on the H200 each new one stalled
        # the instance for seconds. Plain execution of the traced graph has no per-shape cost.
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            result = self.module(*tensors)
        if isinstance(result, torch.Tensor):
            result = (result,)
        elif isinstance(result, dict):
            result = tuple(result[name] for name, _ in self.outputs)
        if len(result) != len(self.outputs):
            raise RuntimeError(f"the module returned {len(result)} tensors; the config declares {len(self.outputs)}")
        # Outputs stay torch tensors (CPU, the config's dtype) and leave through DLPack, not numpy:
        # see _respond.
        return [t.detach().to("cpu").to(_TORCH_DTYPES[dtype]) for t, (_, dtype) in zip(result, self.outputs, strict=True)]

    def _run_batch(self, good: list[tuple[int, list[np.ndarray]]], responses: list[Any]) -> None:
        if not self.batched or len(good) == 1:
            for index, arrays in good:
                responses[index] = self._answer(arrays)
            return
        sizes = [arrays[0].shape[0] for _, arrays in good]
        merged = [np.concatenate([arrays[i] for _, arrays in good]) for i in range(len(self.inputs))]
        try:
            results = self._forward(merged)
        except Exception:  # a failure on the merged batch: answer each request alone
            for index, arrays in good:
                responses[index] = self._answer(arrays)
            return
        offsets = np.cumsum([0, *sizes])
        for (index, _), start, stop in zip(good, offsets[:-1], offsets[1:], strict=True):
            responses[index] = self._respond([r[start:stop] for r in results])

    def _answer(self, arrays: list[np.ndarray]) -> Any:
        try:
            return self._respond(self._forward(arrays))
        except Exception as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"pytorch: {exc}"))

    def _respond(self, results: list[torch.Tensor]) -> Any:
        # DLPack rather than pb_utils.Tensor(name, ndarray): with numpy 2 in the interpreter (the
        # H200 image has 2.5), the 2.51 stub's numpy path produced outputs of zero bytes
        # ("binary_data_size": 0) although the shapes were right; the DLPack path is ABI-neutral.
        tensors = [
            pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(t.contiguous()))
            for (name, _), t in zip(self.outputs, results, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        self.module = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
