"""A Python-based Triton backend named ``onnxruntime``.

The Triton binary that ships in the ``nvidia-pytriton`` wheel carries only the Python backend. Triton
treats a folder ``backends/<name>/model.py`` as a backend called ``<name>``, so this file makes
``platform: "onnxruntime_onnx"`` model configs load unchanged on the embedded server, while the NGC
container serves the very same repository with its native ONNX Runtime backend.

Behaviour that matches the native backend:
- Real batching: the dynamic batcher hands ``execute()`` several requests; their inputs are
  concatenated along the batch axis, the session runs once, and the outputs are split back.
- A bad request inside a batch fails alone; the others in the batch are still answered.
- Thread counts come from the model config parameters ``intra_op_thread_count`` and
  ``inter_op_thread_count``, the keys the native backend reads.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# Triton's config data types -> numpy, for the types our builders emit.
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


def _parameter(config: dict[str, Any], key: str, default: int) -> int:
    raw = config.get("parameters", {}).get(key, {}).get("string_value")
    return int(raw) if raw not in (None, "") else default


class TritonPythonModel:
    """One ONNX Runtime session per model instance."""

    def initialize(self, args: dict[str, str]) -> None:
        self.config = json.loads(args["model_config"])
        filename = self.config.get("default_model_filename") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        options = ort.SessionOptions()
        options.intra_op_num_threads = _parameter(self.config, "intra_op_thread_count", 0)
        options.inter_op_num_threads = _parameter(self.config, "inter_op_thread_count", 0)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.batched = int(self.config.get("max_batch_size", 0)) > 0
        self.inputs = {
            i["name"]: (_TRITON_TO_NUMPY[i["data_type"]], [int(d) for d in i["dims"]])
            for i in self.config["input"]
        }
        self.outputs = [o["name"] for o in self.config["output"]]

    def _check(self, name: str, array: np.ndarray) -> None:
        dtype, dims = self.inputs[name]
        if array.dtype != dtype:
            raise ValueError(f"input '{name}' has dtype {array.dtype}, expected {np.dtype(dtype)}")
        shape = list(array.shape[1:] if self.batched else array.shape)
        if self.batched and array.shape[0] == 0:
            raise ValueError(f"input '{name}' has an empty batch")
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape, strict=False)):
            raise ValueError(f"input '{name}' has shape {list(array.shape)}, expected [batch]+{dims}")

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        good: list[tuple[int, dict[str, np.ndarray]]] = []
        for index, request in enumerate(requests):
            try:
                feeds = {}
                for name in self.inputs:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is None:
                        raise ValueError(f"missing input '{name}'")
                    array = tensor.as_numpy()
                    self._check(name, array)
                    feeds[name] = array
                good.append((index, feeds))
            except ValueError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))

        if good:
            self._run_batch(good, responses)
        return responses

    def _run_batch(self, good: list[tuple[int, dict[str, np.ndarray]]], responses: list[Any]) -> None:
        if not self.batched:
            for index, feeds in good:
                responses[index] = self._respond(self.session.run(self.outputs, feeds))
            return
        sizes = [next(iter(feeds.values())).shape[0] for _, feeds in good]
        merged = {name: np.concatenate([feeds[name] for _, feeds in good]) for name in self.inputs}
        try:
            results = self.session.run(self.outputs, merged)
        except Exception as exc:  # an ORT failure on the merged batch: answer each request alone
            del exc
            for index, feeds in good:
                try:
                    responses[index] = self._respond(self.session.run(self.outputs, feeds))
                except Exception as single:
                    responses[index] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"onnxruntime: {single}")
                    )
            return
        offsets = np.cumsum([0, *sizes])
        for (index, _), start, stop in zip(good, offsets[:-1], offsets[1:], strict=True):
            responses[index] = self._respond([r[start:stop] for r in results])

    def _respond(self, arrays: list[np.ndarray]) -> Any:
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(a)) for name, a in zip(self.outputs, arrays, strict=True)]
        return pb_utils.InferenceResponse(output_tensors=tensors)
