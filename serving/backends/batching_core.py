"""The batching core shared by the Python-based backends (``onnxruntime``, ``pytorch``).

Triton's dynamic batcher hands ``execute()`` several requests and the Python backend does no batching
itself (server#5926). This module does it once, for every Python-based backend::

    requests -> gather   (each request's inputs fetched and checked against the config)
             -> concatenate along the batch axis -> run once -> split the outputs back -> responses

Per-request errors, so that no request can fail another:

- a request whose inputs do not match the config (missing input, dtype, shape, empty batch, inputs
  with different batch sizes) fails alone with ``INVALID_ARG`` and a message naming the input;
- if anything on the merged batch raises (concatenation, the runtime, outputs of the wrong size),
  every request is run again alone, so only the one the runtime cannot take fails;
- a failure inside the runtime is answered with a fixed message naming the model: the exception
  (type, library message, traceback, file paths) goes to Triton's log, never to the client.

Ragged batching: an input whose config sets ``allow_ragged_batch`` lets Triton's dynamic batcher put
requests of different lengths in one execution (without it, the batcher cuts a batch at the first
request whose shape differs, so mixed-length traffic barely batches). Triton's native backends would
concatenate such an input into one flat tensor; here each request still arrives whole, so the core
sorts the requests by length (axis 1 of their ragged inputs, which must agree within a request), groups
them (``ragged_groups.py``: by cost or by length edges), zero-pads each group's ragged inputs to the
group's longest, runs each group once, and slices every output whose first axis after the batch is
dynamic back to each request's own length. Zero padding is only right for models that mask it out (a
transformer's ``attention_mask`` of 0).

A backend subclasses :class:`BatchingModel` and keeps only what differs: :meth:`~BatchingModel.load`
(session or module, device) and :meth:`~BatchingModel.run` (merged inputs -> outputs). A runner that
keeps tensors elsewhere (torch on a GPU) overrides :meth:`~BatchingModel.to_array`,
:meth:`~BatchingModel.concatenate` and :meth:`~BatchingModel.to_tensor`; validation, splitting and
error handling stay here.

Outputs leave through DLPack, not ``pb_utils.Tensor(name, ndarray)``: with numpy 2 in the interpreter,
the Triton 2.51 stub's numpy path produced outputs of zero bytes although their shapes were right;
DLPack is ABI-neutral, so the backends work with numpy 1.x and 2.x. Inputs come in the same way (the
stub's ``as_numpy()`` returns wrong values under numpy 2). Numpy arrays cross as torch tensors
sharing their memory (``torch.from_numpy``, ``.numpy()``: no copy): numpy's own DLPack capsules
crashed the 2.51 stub (it renames a consumed capsule ``used_dlpack``, which numpy's capsule destructor
does not recognise), torch's are handled. Without torch the numpy path is used, which is fine under
numpy 1.x; :meth:`BatchingModel.initialize` logs a warning for numpy 2 without torch.

``execute()``'s time is on Triton's ``/metrics`` page (``step_metrics.py``) in four steps: ``inputs``
(reading the requests), ``run`` (merging, queueing the model's work), ``wait`` (for the device,
:meth:`BatchingModel.wait`; nothing on the CPU) and ``respond`` (the responses).

Deployment: Triton imports a Python-based backend's ``model.py`` with that backend's folder on
``sys.path``, so this file, ``ragged_groups.py`` and ``step_metrics.py`` sit beside each ``model.py``:
``serving.launcher.assemble_backends`` copies them there (and into a NGC container's
``/opt/tritonserver/backends/<name>/`` by hand, see the README).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import triton_python_backend_utils as pb_utils

if TYPE_CHECKING:
    from serving.backends.ragged_groups import Pending, length_groups
    from serving.step_metrics import StepTimes
else:  # Triton imports this file with its folder (holding copies of both modules) on sys.path
    from ragged_groups import Pending, length_groups
    from step_metrics import StepTimes

_torch: Any
try:
    import torch as _torch
    import torch.utils.dlpack  # noqa: F401  (a submodule torch does not import by itself)
except ImportError:  # the numpy path (numpy 1.x) carries the outputs then
    _torch = None

__all__ = ["BatchingModel", "RequestError", "TensorConfig", "parameter", "tensor_configs"]

#: longest exception summary written to Triton's log per failure (a hostile input must not flood it)
_LOG_CHARS = 500
#: the steps of ``execute()`` on Triton's ``/metrics`` page (see the module docstring)
STEPS = ("inputs", "run", "wait", "respond")


class RequestError(ValueError):
    """One request does not fit the model; the message names the problem and is safe to send back."""


@dataclass(frozen=True)
class TensorConfig:
    """One ``input`` / ``output`` entry of the model config. ``dims`` exclude the batch axis."""

    name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    ragged: bool = False  # ``allow_ragged_batch``: requests of different lengths may share a batch


def tensor_configs(entries: Sequence[Mapping[str, Any]]) -> list[TensorConfig]:
    """The config's tensors, with dtypes mapped by Triton's own table (``pb_utils``)."""
    return [
        TensorConfig(
            e["name"],
            np.dtype(pb_utils.triton_string_to_numpy(e["data_type"])),
            tuple(int(d) for d in e.get("dims", ())),
            bool(e.get("allow_ragged_batch", False)),
        )
        for e in entries
    ]


def parameter(config: Mapping[str, Any], key: str, default: str) -> str:
    """The config's ``parameters { key: ... value { string_value: ... } }``, or ``default`` when unset."""
    raw = config.get("parameters", {}).get(key, {}).get("string_value")
    return str(raw) if raw not in (None, "") else default


def dtype_name(value: Any) -> str:
    """``float32`` for a numpy array or a torch tensor alike (torch spells it ``torch.float32``)."""
    return str(value.dtype).removeprefix("torch.")


class BatchingModel(ABC):
    """Base of a Python-based backend's ``TritonPythonModel``: validate, concatenate, run once, split.

    Attributes set by :meth:`initialize` before :meth:`load` runs: ``config`` (the model config as a
    dict), ``model_name``, ``batched`` (``max_batch_size > 0``), ``inputs`` and ``outputs`` (in the
    order :meth:`run` takes and returns them, see :meth:`order`).
    """

    #: the backend's name, used in log lines and error messages
    backend = "python"

    def initialize(self, args: dict[str, str]) -> None:
        self.config: dict[str, Any] = json.loads(args["model_config"])
        self.model_name = args.get("model_name") or self.config.get("name", "")
        self.batched = int(self.config.get("max_batch_size", 0)) > 0
        self.inputs = self.order(tensor_configs(self.config.get("input", [])))
        self.outputs = self.order(tensor_configs(self.config.get("output", [])))
        self.ragged = self.batched and any(t.ragged for t in self.inputs)
        self.length_buckets = tuple(
            sorted(
                int(v) for v in self.parameter("ragged_length_buckets", "").split(",") if v.strip()
            )
        )
        self.run_cost = float(self.parameter("ragged_run_cost", "0") or 0)
        self.steps = StepTimes(pb_utils, self.model_name, args.get("model_version", ""), STEPS)
        if _torch is None and int(np.__version__.split(".")[0]) >= 2:
            self.log(
                "warn",
                "numpy 2 without torch: the Triton 2.51 stub's numpy output path can send empty "
                "outputs; install torch beside the backends",
            )
        self.load(args)

    @abstractmethod
    def load(self, args: dict[str, str]) -> None:
        """Load the model (Triton's ``initialize`` arguments: repository, version, instance kind)."""

    @abstractmethod
    def run(self, inputs: list[Any]) -> Sequence[Any]:
        """Run the model once on ``inputs`` (in ``self.inputs`` order, batch axis first when batched);
        return the outputs in ``self.outputs`` order."""

    def wait(self, outputs: Sequence[Any]) -> Sequence[Any]:
        """``outputs`` once they are ready: a runner that only queues work on a device in :meth:`run`
        (and its copy back) waits for it here, so the wait is timed as a step of its own."""
        return outputs

    def order(self, tensors: list[TensorConfig]) -> list[TensorConfig]:
        """The order :meth:`run` takes inputs and returns outputs in: the config's, unless overridden."""
        return tensors

    def parameter(self, key: str, default: str) -> str:
        return parameter(self.config, key, default)

    def log(self, level: str, message: str) -> None:
        """A line in Triton's log (``info``, ``warn`` or ``error``), prefixed with backend and model."""
        getattr(pb_utils.Logger, f"log_{level}")(
            f"{self.backend} backend, model '{self.model_name}': {message}"
        )

    # Hooks for another array type (torch on a GPU). The defaults keep numpy arrays on the CPU.

    def to_array(self, tensor: Any, spec: TensorConfig) -> Any:
        """A request's input tensor as the array :meth:`run` takes (dtype and shape are checked after).

        A numpy array, read through DLPack (a torch tensor sharing the memory) where it can be: under
        numpy 2 the 2.51 stub's ``as_numpy()`` returns wrong values for numeric tensors.
        """
        if _torch is None or spec.dtype == np.object_ or not tensor.is_cpu():
            return tensor.as_numpy()
        return _torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).numpy()

    def concatenate(self, parts: list[Any]) -> Any:
        return np.concatenate(parts)

    def pad(self, array: Any, length: int) -> Any:
        """``array`` zero-padded along axis 1 to ``length`` (a ragged input of a shorter request)."""
        if array.shape[1] == length:
            return array
        widths = [(0, 0)] * array.ndim
        widths[1] = (0, length - array.shape[1])
        return np.pad(array, widths)

    def to_tensor(self, spec: TensorConfig, value: Any) -> Any:
        """An output (a request's slice) as a ``pb_utils.Tensor`` of the config's dtype."""
        if not isinstance(value, np.ndarray):
            return pb_utils.Tensor.from_dlpack(spec.name, value)
        array = np.ascontiguousarray(value.astype(spec.dtype, copy=False))
        if spec.dtype == np.object_ or _torch is None:  # strings cannot travel through DLPack
            return pb_utils.Tensor(spec.name, array)
        return pb_utils.Tensor.from_dlpack(spec.name, _torch.from_numpy(array))

    # The batching core.

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        with self.steps.step("inputs"):
            pending = self._read(requests, responses)
        for group in self.groups(pending):
            if self.batched and len(group) > 1 and self._run_merged(group, responses):
                continue
            for item in group:
                responses[item.index] = self._run_alone(item)
        self.steps.executed(sum(p.size for p in pending))
        return responses

    def _read(self, requests: list[Any], responses: list[Any]) -> list[Pending]:
        """Each request's inputs, gathered and checked; a request that fails gets its error response."""
        pending: list[Pending] = []
        for index, request in enumerate(requests):
            try:
                arrays = self.gather(request)
                pending.append(
                    Pending(
                        index,
                        arrays,
                        int(arrays[0].shape[0]) if self.batched and arrays else 1,
                        self._length(arrays),
                    )
                )
            except RequestError as exc:
                responses[index] = _error(str(exc), pb_utils.TritonError.INVALID_ARG)
            except Exception as exc:  # reading a request must never fail the others
                responses[index] = self._failure(exc, "reading the request")
        return pending

    def groups(self, pending: list[Pending]) -> list[list[Pending]]:
        """The requests that run together: all of them, or for ragged inputs, by length bucket."""
        if not self.ragged or len(pending) < 2:
            return [pending] if pending else []
        return length_groups(pending, self.length_buckets, self.run_cost)

    def _length(self, arrays: list[Any]) -> int:
        """The common axis-1 length of a request's ragged inputs (0 without ragged inputs).

        Raises:
            RequestError: the ragged inputs of the request disagree on their length.
        """
        if not self.ragged:
            return 0
        lengths = {
            int(a.shape[1]) for a, spec in zip(arrays, self.inputs, strict=True) if spec.ragged
        }
        if len(lengths) != 1:
            names = ", ".join(spec.name for spec in self.inputs if spec.ragged)
            raise RequestError(f"inputs {names} must have the same length, got {sorted(lengths)}")
        return lengths.pop()

    def gather(self, request: Any) -> list[Any]:
        """The request's inputs in ``self.inputs`` order, each checked against the config.

        Raises:
            RequestError: an input is missing or its dtype, shape or batch size does not fit.
        """
        arrays, sizes = [], set()
        for spec in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is None:
                raise RequestError(f"missing input '{spec.name}'")
            shape = [int(d) for d in tensor.shape()]
            _check_shape(spec, shape, self.batched)
            array = self.to_array(tensor, spec)
            if dtype_name(array) != spec.dtype.name:
                raise RequestError(
                    f"input '{spec.name}' has dtype {dtype_name(array)}, expected {spec.dtype.name}"
                )
            if list(array.shape) != shape:
                raise RequestError(
                    f"input '{spec.name}' has shape {list(array.shape)}, declared {shape}"
                )
            arrays.append(array)
            if self.batched:
                sizes.add(shape[0])
        if len(sizes) > 1:
            raise RequestError(f"inputs have different batch sizes {sorted(sizes)}")
        return arrays

    def _run_merged(self, pending: list[Pending], responses: list[Any]) -> bool:
        """One run for every pending request; False (nothing answered) if any step of it raised."""
        try:
            longest = max(p.length for p in pending)
            merged = [
                self.concatenate(
                    [
                        self.pad(p.arrays[i], longest) if spec.ragged else p.arrays[i]
                        for p in pending
                    ]
                )
                for i, spec in enumerate(self.inputs)
            ]
            outputs = self._checked_run(merged, sum(p.size for p in pending))
            with self.steps.step("respond"):
                answers, start = [], 0
                for item in pending:
                    stop = start + item.size
                    answers.append(
                        self._respond(
                            [
                                self._own_length(spec, out[start:stop], item)
                                for spec, out in zip(self.outputs, outputs, strict=True)
                            ]
                        )
                    )
                    start = stop
        except Exception as exc:
            self.log(
                "warn",
                f"a batch of {len(pending)} requests failed ({_summary(exc)}); running each alone",
            )
            return False
        for item, answer in zip(pending, answers, strict=True):
            responses[item.index] = answer
        return True

    def _own_length(self, spec: TensorConfig, value: Any, item: Pending) -> Any:
        """A ragged batch's output cut back to the request's own length (outputs with a dynamic axis 1)."""
        if self.ragged and spec.dims and spec.dims[0] == -1 and len(value.shape) > 1:
            return value[:, : item.length]
        return value

    def _run_alone(self, item: Pending) -> Any:
        try:
            outputs = self._checked_run(item.arrays, item.size if self.batched else None)
            with self.steps.step("respond"):
                return self._respond(outputs)
        except Exception as exc:
            return self._failure(exc, "running the model")

    def _checked_run(self, inputs: list[Any], batch: int | None) -> Sequence[Any]:
        with self.steps.step("run"):
            queued = self.run(inputs)
        with self.steps.step("wait"):
            outputs = list(self.wait(queued))
        if len(outputs) != len(self.outputs):
            raise RuntimeError(
                f"the model returned {len(outputs)} outputs; the config declares {len(self.outputs)}"
            )
        if batch is not None:
            sizes = [int(out.shape[0]) if len(out.shape) else 0 for out in outputs]
            if any(size != batch for size in sizes):
                raise RuntimeError(f"outputs have batch sizes {sizes} for a batch of {batch}")
        return outputs

    def _respond(self, outputs: Sequence[Any]) -> Any:
        tensors = [
            self.to_tensor(spec, value) for spec, value in zip(self.outputs, outputs, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _failure(self, exc: BaseException, stage: str) -> Any:
        self.log("error", f"{stage} failed: {_summary(exc)}")
        return _error(
            f"model '{self.model_name}' could not process this request (the server log has the "
            "details)",
            pb_utils.TritonError.INTERNAL,
        )


def _check_shape(spec: TensorConfig, shape: list[int], batched: bool) -> None:
    rank = len(spec.dims) + (1 if batched else 0)
    if batched and len(shape) == rank and shape[0] == 0:
        raise RequestError(f"input '{spec.name}' has an empty batch")
    dims = shape[1:] if batched else shape
    if len(shape) != rank or any(d != -1 and d != s for d, s in zip(spec.dims, dims, strict=True)):
        expected = ", ".join(["batch"] * batched + [str(d) for d in spec.dims])
        raise RequestError(
            f"input '{spec.name}' has shape {shape}, expected [{expected}] (-1: any size)"
        )


def _error(message: str, code: Any) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _summary(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= _LOG_CHARS else text[:_LOG_CHARS] + "..."
