"""Self-healing: a model whose worker died is reloaded alone, through Triton's repository API.

Triton does not replace a Python stub that died (killed, out of memory): the model stays READY and
every request that lands on the dead instance fails with "Stub process '<instance>' is not healthy"
until the model is loaded again. The gateway sees those answers first (on every replica, in k8s as
on one host), so it heals:

1. :class:`gateway.backends.model_breaker.Breakers` opens the model's breaker on a dead-stub answer (or on
   repeated internal errors); its requests get 503 + Retry-After meanwhile;
2. the failing model alone (the model called, or the pipeline step whose instance died, e.g. an
   ensemble's tokenizer) is loaded again (``POST /v2/repository/models/<m>/load``): Triton swaps in
   fresh instances; other models are not touched;
3. each waiting model answers one synthetic inference (:func:`gateway.backends.readiness.synthetic_inputs`,
   the readiness probe's request) before its breaker closes; a failed load or probe is retried with
   exponential back-off (``first_backoff_s`` doubling up to ``max_backoff_s``), for as long as it takes.

A reload is idempotent: loading a model Triton already serves swaps in fresh instances of the same
files, and Triton serialises concurrent loads of one model, so replicas (or workers) that each heal
the same failure cost an extra load each, never a wrong model. The dead stub's shared memory in
``/dev/shm`` is the Triton host's to remove (:mod:`serving.stub_watch`).

Events go to the log; Prometheus: ``gateway_model_reloads_total{model,outcome}``,
``gateway_model_breaker_trips_total{model}`` and ``gateway_model_breaker_open{model}`` (1 while open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.backends.model_breaker import Breakers, Trip
from gateway.backends.readiness import synthetic_inputs
from gateway.backends.triton import InferenceBackend
from gateway.errors import GatewayError, ModelUnhealthy

__all__ = [
    "DEFAULT_HEAL_FIRST_BACKOFF_S",
    "DEFAULT_HEAL_LOAD_TIMEOUT_S",
    "DEFAULT_HEAL_MAX_BACKOFF_S",
    "ModelHealer",
]

log = logging.getLogger(__name__)

DEFAULT_HEAL_FIRST_BACKOFF_S = 1.0
DEFAULT_HEAL_MAX_BACKOFF_S = 30.0
#: a model load can take a while (a large ONNX graph, a diffusion pipeline's first run)
DEFAULT_HEAL_LOAD_TIMEOUT_S = 120.0


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class ModelHealer:
    """Owns the breakers and heals what opens them (the module docstring says how).

    Args:
        backend: the inference server (loads and probes go through it).
        breakers: the per-model breakers.
        registry: the Prometheus registry the metrics are added to.
        load_timeout_s: deadline of one load call.
        probe_timeout_s: deadline of one synthetic inference after a load.
        first_backoff_s: wait before the second attempt; it doubles per failed attempt.
        max_backoff_s: longest wait between attempts.
        under_rollout: whether a rollout routes a model's traffic by weight now. Its internal errors
            then count for nothing here: they are the rollout's to judge (promote rolls a failing
            canary back), and a reload would re-apply the version set it read, racing the rollback.
            A dead worker still opens the breaker.
    """

    backend: InferenceBackend
    breakers: Breakers
    registry: InitVar[CollectorRegistry]
    _: KW_ONLY
    load_timeout_s: float = DEFAULT_HEAL_LOAD_TIMEOUT_S
    probe_timeout_s: float = 30.0
    first_backoff_s: float = DEFAULT_HEAL_FIRST_BACKOFF_S
    max_backoff_s: float = DEFAULT_HEAL_MAX_BACKOFF_S
    under_rollout: Callable[[str], bool] = lambda model: False

    def __post_init__(self, registry: CollectorRegistry) -> None:
        self._waiting: dict[str, set[str]] = {}  # reload target -> models whose breakers wait on it
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.reloads = Counter(
            "gateway_model_reloads",
            "Model reloads the gateway asked Triton for, by outcome.",
            ["model", "outcome"],
            registry=registry,
        )
        self.trips = Counter(
            "gateway_model_breaker_trips",
            "Times a model's circuit breaker opened.",
            ["model"],
            registry=registry,
        )
        self.open = Gauge(
            "gateway_model_breaker_open",
            "1 while a model's circuit breaker is open (503s).",
            ["model"],
            registry=registry,
            multiprocess_mode="livemax",
        )

    def check(self, model: str) -> None:
        """Refuse a request for ``model`` while its breaker is open.

        Raises:
            ModelUnhealthy: it is; 503 with Retry-After.
        """
        self.breakers.check(model)

    def observe(self, model: str, exc: BaseException | None) -> None:
        """The outcome of one admitted request for ``model`` (``None``: answered)."""
        if exc is None:
            self.breakers.success(model)
            return
        if not isinstance(exc, GatewayError):
            return
        if not isinstance(exc, ModelUnhealthy) and self.under_rollout(model):
            return
        trip = self.breakers.failure(model, exc)
        if trip is not None:
            self._start(trip)

    def _start(self, trip: Trip) -> None:
        log.warning(
            "model %r: circuit breaker open (%s); reloading %r",
            trip.model,
            trip.reason,
            trip.target,
        )
        self.trips.labels(trip.model).inc()
        self.open.labels(trip.model).set(1)
        self._waiting.setdefault(trip.target, set()).add(trip.model)
        if trip.target not in self._tasks:
            self._tasks[trip.target] = asyncio.create_task(
                self._heal(trip.target), name=f"heal {trip.target}"
            )

    async def _heal(self, target: str) -> None:
        backoff = self.first_backoff_s
        attempt = 0
        try:
            while self._waiting.get(target):
                attempt += 1
                if await self._attempt(target, attempt):
                    return
                for model in self._waiting.get(target, ()):
                    self.breakers.retry_at(model, time.monotonic() + backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            self._tasks.pop(target, None)

    async def _attempt(self, target: str, attempt: int) -> bool:
        """One reload of ``target`` and a probe of every model waiting on it; whether all passed."""
        started = time.monotonic()
        try:
            await self.backend.reload_model(target, timeout_s=self.load_timeout_s)
        except GatewayError as exc:
            self.reloads.labels(target, "failed").inc()
            log.error("model %r: reload attempt %d failed: %s", target, attempt, exc.detail)
            return False
        self.reloads.labels(target, "ok").inc()
        log.warning(
            "model %r: reloaded in %.1f s (attempt %d)", target, time.monotonic() - started, attempt
        )
        waiting = self._waiting.get(target, set())
        for model in sorted(waiting):
            problem = await self._probe(model)
            if problem is not None:
                log.error("model %r: still failing after reloading %r: %s", model, target, problem)
                continue
            waiting.discard(model)
            was_open = self.breakers.close(model)
            self.open.labels(model).set(0)
            log.warning("model %r: circuit breaker closed after %.1f s", model, was_open)
        if waiting:
            return False
        self._waiting.pop(target, None)
        return True

    async def _probe(self, model: str) -> str | None:
        try:
            config = await self.backend.model_config(model, timeout_s=self.probe_timeout_s)
            await self.backend.infer(
                model, synthetic_inputs(config), None, timeout_s=self.probe_timeout_s
            )
        except GatewayError as exc:
            return exc.detail
        except (
            ValueError
        ) as exc:  # a config no probe can fill: the breaker stays open, the log says why
            return str(exc)
        return None

    async def close(self) -> None:
        """Stop healing (at shutdown)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
