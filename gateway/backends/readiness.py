"""Honest readiness: the models the gateway must serve are READY in Triton and answer a real request.

Triton's server readiness says nothing about one model: a model that failed to load, was unloaded,
or loads but fails every request (a missing Python package in the image, a broken engine) still
leaves ``/v2/health/ready`` true when ``--strict-readiness`` does not cover it. ``/readyz`` asks more
(``GATEWAY_READY_MODELS``): for each configured model,

1. Triton's model readiness (``/v2/models/<m>/ready``), then
2. one small synthetic inference built from the model's own configuration
   (:func:`serving.readiness.probe_inputs`, the same request the Triton pod's readiness probe sends).

Triton's server readiness is asked on every probe (one cheap call); the models' answer is cached
for ``GATEWAY_READY_CACHE_S`` (probes of every replica arrive every few seconds; they must not
become load), and concurrent probes share one check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from gateway.backends.triton import InferenceBackend, Tensor
from gateway.errors import GatewayError
from serving.readiness import probe_inputs

__all__ = ["ModelProblem", "Readiness", "ReadinessProbe", "synthetic_inputs"]


@dataclass(frozen=True)
class ModelProblem:
    """Why one configured model is not ready."""

    model: str
    reason: str


@dataclass(frozen=True)
class Readiness:
    """One readiness check's outcome."""

    server_ready: bool
    problems: tuple[ModelProblem, ...] = ()
    checked: tuple[str, ...] = ()
    checked_at: float = field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        return self.server_ready and not self.problems

    def describe(self) -> str:
        """One line naming what is not ready (for the 503 body and the log)."""
        parts = [] if self.server_ready else ["Triton is not ready"]
        if self.problems:
            parts.append(
                "not ready: " + "; ".join(f"{p.model} ({p.reason})" for p in self.problems)
            )
        return "; ".join(parts)


def synthetic_inputs(config: Mapping[str, Any]) -> list[Tensor]:
    """The synthetic request of :func:`serving.readiness.probe_inputs` as the backend's tensors.

    Raises:
        ValueError: the configuration names a datatype no probe can fill.
    """
    tensors = []
    for item in probe_inputs(config):
        if item.datatype == "BYTES":
            data = np.full(item.shape, item.value, dtype=np.object_)
        else:
            data = np.full(item.shape, item.number, dtype=triton_to_np_dtype(item.datatype))
        tensors.append(Tensor(item.name, data))
    return tensors


class ReadinessProbe:
    """Checks the configured models (cached), as the module docstring says.

    Args:
        backend: the inference server.
        models: the Triton models that must be ready (empty: Triton's server readiness only).
        cache_s: how long an answer is reused.
        timeout_s: the deadline of each call to Triton (one readiness read, one inference).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        backend: InferenceBackend,
        models: Sequence[str],
        *,
        cache_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self.models = tuple(models)
        self._cache_s = cache_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._last: Readiness | None = None
        self._lock = asyncio.Lock()

    async def check(self) -> Readiness:
        """The readiness of Triton (asked every time: one cheap call) and of every configured model
        (reused for ``cache_s``: a check costs one inference per model).

        Models are checked even when Triton says it is not ready: with strict readiness one model
        that is not READY makes the whole server not ready, and the answer should name it.
        """
        now = self._clock()
        server_ready = await self._backend.server_ready(timeout_s=self._timeout_s)
        if not self.models:
            return Readiness(server_ready=server_ready, checked_at=now)
        if not self._fresh():
            async with self._lock:
                if not self._fresh():  # another probe may have checked while this one waited
                    self._last = await self._check_models()
        assert self._last is not None
        return replace(self._last, server_ready=server_ready)

    def _fresh(self) -> bool:
        return self._last is not None and self._clock() - self._last.checked_at < self._cache_s

    async def _check_models(self) -> Readiness:
        now = self._clock()
        results = await asyncio.gather(*(self._model_problem(m) for m in self.models))
        problems = tuple(p for p in results if p is not None)
        return Readiness(server_ready=True, problems=problems, checked=self.models, checked_at=now)

    async def _model_problem(self, model: str) -> ModelProblem | None:
        try:
            if not await self._backend.model_ready(model, timeout_s=self._timeout_s):
                return ModelProblem(model, "not READY in Triton")
            config = await self._backend.model_config(model, timeout_s=self._timeout_s)
        except GatewayError as exc:
            return ModelProblem(model, exc.detail)
        try:
            inputs = synthetic_inputs(config)
            await self._backend.infer(model, inputs, None, timeout_s=self._timeout_s)
        except GatewayError as exc:
            return ModelProblem(model, f"synthetic inference failed: {exc.detail}")
        except ValueError as exc:
            return ModelProblem(model, str(exc))
        return None
