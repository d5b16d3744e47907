"""Triton Python models: each request of a batch answered alone, a failure saying no more than it
should.

A request's own fault (an exception of the kinds the model names as refusals) fails that request with
``INVALID_ARG`` and the exception's message. Anything else fails it with ``INTERNAL`` and a fixed
message, the exception going to Triton's log only: it may hold paths, shapes or library internals a
client must not see. Either way the other requests of the batch are answered.

Numpy-free and stub-free, so the models that use it import it in tests too; the build ships it
beside each ``model.py`` (the entries' ``files``), where Triton's stub finds it by file name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LOG_CHARS", "PerRequest", "RequestRefused"]

#: longest exception summary written to Triton's log per failure
LOG_CHARS = 300


class RequestRefused(ValueError):
    """The request itself is wrong: its message goes to the client."""


@dataclass(frozen=True)
class PerRequest:
    """How one model answers.

    Attributes:
        pb: the stub's ``triton_python_backend_utils`` module.
        model: the model's name, in the log and the fixed message.
        stage: what the model does, for its log ("tokenizing failed: ...").
        refused: the exceptions that are a request's own fault.
    """

    pb: Any
    model: str
    stage: str
    refused: tuple[type[Exception], ...] = (RequestRefused,)

    def answer(self, requests: Sequence[Any], outputs: Callable[[Any], list[Any]]) -> list[Any]:
        """One response per request: ``outputs(request)``'s tensors, or why it failed."""
        return [self._one(request, outputs) for request in requests]

    def _one(self, request: Any, outputs: Callable[[Any], list[Any]]) -> Any:
        pb = self.pb
        try:
            return pb.InferenceResponse(outputs(request))
        except self.refused as exc:
            return pb.InferenceResponse(error=pb.TritonError(str(exc), pb.TritonError.INVALID_ARG))
        except Exception as exc:  # anything else fails this request only, without internals
            summary = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:LOG_CHARS]
            pb.Logger.log_error(f"model '{self.model}': {self.stage} failed: {summary}")
            return pb.InferenceResponse(
                error=pb.TritonError(
                    f"model '{self.model}' could not process this request (the server log has "
                    "the details)",
                    pb.TritonError.INTERNAL,
                )
            )
