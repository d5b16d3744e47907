"""Many models, one Triton instance: load on demand, evict the least recently used under a budget.

On when ``GATEWAY_RESIDENCY_BUDGET_BYTES`` is set (Triton in explicit model-control mode). Then:

- **Hot path.** A request for a LOADED model counts itself in flight and goes on: no lock, no
  await (:meth:`ResidencyManager.hold`). Only a request for a model that is not loaded waits.
- **One load per model.** The first request for a cold model puts it on a bounded queue with a
  future; every later request for it awaits the same future, each within its own deadline. A full
  queue is a 429 (a load storm sheds its cold requests; hot ones never wait on it).
- **Loads are decided one at a time** by one background worker: room, evictions and the new
  model's charge are settled before the next load is considered, so charges never pass the budget.
  Triton's part of a load (for a Python-backend model: a stub process, its imports, a CUDA context;
  seconds) runs in a task of its own, up to ``max_concurrent_loads`` at once; the footprint is
  measured and remembered there (:mod:`gateway.backends.residency_loading`).
- **Eviction** picks victims with :meth:`gateway.backends.residency_policy.ResidencyTable.victims`
  (least recently used, never pinned, never with requests in flight, never a step another resident
  ensemble uses) and only when evicting them makes room; :mod:`gateway.backends.residency_eviction`
  claims them at once and waits for requests in flight rather than dropping them. A model bigger
  than the whole budget is refused (507) before anything is evicted.
- **Failures** stay with their model: a failed load answers its waiters with a 503, evicts nothing
  more, and the model is not retried before a backoff (doubling, capped) has passed.
- **Ensembles**: Triton loads an ensemble's steps with it. Steps that were not loaded before are
  *carried* (charged nothing: the ensemble's footprint holds them) and unloaded with the last
  ensemble that holds them; a step with other holders, or loaded for itself, stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable

from prometheus_client import CollectorRegistry

from gateway.backends.residency_eviction import Evictor
from gateway.backends.residency_loading import Loader
from gateway.backends.residency_memory import MemoryMeter
from gateway.backends.residency_metrics import MemoryReadings, ResidencyMetrics
from gateway.backends.residency_policy import (
    Entry,
    ModelResidency,
    ResidencyConfig,
    ResidencyTable,
    State,
)
from gateway.backends.residency_triton import TritonRepository
from gateway.errors import (
    GatewayError,
    ModelLoadFailed,
    ModelNotReady,
    ModelTooLarge,
    Overloaded,
    UpstreamTimeout,
)

__all__ = ["ResidencyManager"]

log = logging.getLogger(__name__)


class ResidencyManager:
    """Keeps the models one Triton instance holds within a memory budget (module docstring).

    Args:
        config: the behaviour.
        repository: Triton's repository extension.
        meter: reads Triton's memory.
        registry: where the Prometheus metrics go.
    """

    def __init__(
        self,
        config: ResidencyConfig,
        repository: TritonRepository,
        meter: MemoryMeter,
        registry: CollectorRegistry,
    ) -> None:
        self.config = config
        self.repository = repository
        self.meter = meter
        self.table = ResidencyTable(config.budget_bytes)
        self.metrics = ResidencyMetrics(registry, config.budget_bytes)
        self.readings = MemoryReadings(self.metrics)
        self.evictor = Evictor(
            self.table, repository, meter, self.metrics, self.readings, config.drain_timeout_s
        )
        self.loader = Loader(config, self.table, repository, meter, self.evictor)
        self._queue: asyncio.Queue[str] = asyncio.Queue(maxsize=config.max_pending_loads)
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._worker: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(config.max_concurrent_loads)
        self._loads: set[asyncio.Task[None]] = set()
        #: Triton's memory when the manager started (before any load of its own)
        self.baseline_bytes = 0

    @property
    def measured_bytes(self) -> int:
        """Triton's memory at the last reading (start, load or eviction)."""
        return self.readings.measured_bytes

    # -- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Read Triton's index (what is loaded now) and start the load worker."""
        index = await self.repository.index()
        now = time.monotonic()
        for name, info in index.items():
            entry = self.loader.entry(name)
            if info.get("state") == "READY":
                entry.state = State.LOADED
                entry.last_used = now
                entry.pinned = self.config.pin_loaded_at_start
        for name in self.config.pinned:
            if name in self.table.entries:
                self.table.entries[name].pinned = True
        for entry in list(self.table.entries.values()):
            if entry.state is State.LOADED:
                await self.loader.note_steps(entry, before=None)
        self.baseline_bytes = await self.meter.used_bytes()
        self.readings.record(self.baseline_bytes)
        self.loader.update_charged()
        self._worker = asyncio.create_task(self._work())

    async def close(self) -> None:
        """Stop the worker; waiters still queued are told the gateway is stopping."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        for task in list(self._loads):
            task.cancel()
        for task in list(self._loads):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ModelNotReady("the gateway is stopping", retry_after_s=1))
                future.exception()  # retrieved: nobody may be waiting any more
        await self.repository.close()
        await self.meter.close()

    # -- the request path ------------------------------------------------------------------------

    def loaded(self, model: str) -> bool:
        """Whether a request for ``model`` can go on at once (no load to wait for)."""
        entry = self.table.entries.get(model)
        return entry is not None and entry.usable

    async def ensure(self, model: str, deadline: float) -> None:
        """Wait until ``model`` is loaded (loading it if need be); :meth:`hold` says what it raises."""
        entry = self.loader.entry(model)
        # Bounded: each round either finds it loaded or waits for a load that ends or fails.
        for _ in range(8):
            if entry.usable:
                return
            await self._wait_loaded(entry, deadline)
        raise ModelNotReady(
            f"model '{model}' was evicted again while its requests waited", retry_after_s=1
        )

    @contextlib.asynccontextmanager
    async def hold(self, model: str, deadline: float) -> AsyncIterator[None]:
        """Keep ``model`` loaded while the block runs; load it first if it is not.

        Args:
            model: a Triton model the catalog knows.
            deadline: ``time.monotonic()`` by which the request must be answered.

        Raises:
            ModelTooLarge: its footprint exceeds the whole budget.
            ModelLoadFailed: its load failed (now or recently; Retry-After says when to try again).
            Overloaded: too many loads are queued.
            ModelNotReady: no room can be made (pinned models and requests in flight hold it all).
            UpstreamTimeout: the deadline passed while it loaded.
        """
        entry = self.loader.entry(model)
        if not entry.usable:
            await self.ensure(model, deadline)
        entry.in_flight += 1
        entry.last_used = time.monotonic()
        try:
            yield
        finally:
            entry.in_flight -= 1
            entry.last_used = time.monotonic()
            if not entry.in_flight:
                self.evictor.released()

    async def _wait_loaded(self, entry: Entry, deadline: float) -> None:
        future = self._pending.get(entry.name)
        if future is None:
            future = self._enqueue(entry)
        left = deadline - time.monotonic()
        if left <= 0:
            raise UpstreamTimeout(
                f"the request's deadline passed while model '{entry.name}' loaded"
            )
        # Counted as waiting: the load's next victim choice (which may run before this request wakes)
        # must not take the model it loaded for it.
        entry.waiters += 1
        try:
            await asyncio.wait_for(asyncio.shield(future), left)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"the request's deadline passed while model '{entry.name}' loaded"
            ) from exc
        finally:
            entry.waiters -= 1

    def _enqueue(self, entry: Entry) -> asyncio.Future[None]:
        now = time.monotonic()
        if entry.retry_at > now:
            raise ModelLoadFailed(
                f"model '{entry.name}' failed to load {entry.failures} time(s); the next attempt "
                f"is allowed in {entry.retry_at - now:.0f} s",
                retry_after_s=entry.retry_at - now,
            )
        self._check_fits(entry)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(entry.name)
        except asyncio.QueueFull:
            raise Overloaded(
                f"{self._queue.qsize()} model loads are already queued; retry shortly",
                retry_after_s=1,
            ) from None
        self._pending[entry.name] = future
        return future

    def _check_fits(self, entry: Entry) -> None:
        if not self.table.fits_alone(entry):
            what = "measured" if entry.measured else "estimated"
            raise ModelTooLarge(
                f"model '{entry.name}' needs {entry.size_bytes} bytes ({what}), more than this Triton "
                f"instance's memory budget of {self.table.budget_bytes} bytes allows beside its "
                "pinned models",
                field="model",
            )

    # -- the load worker -------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            name = await self._queue.get()
            await self._slots.acquire()
            entry = self.loader.entry(name)
            try:
                started = await self._prepare(entry)
            except BaseException as exc:
                self._slots.release()
                self._settle(name, exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            if not started:
                self._slots.release()
                self._settle(name, None)
                continue
            task = asyncio.create_task(self._finish_load(entry))
            self._loads.add(task)
            task.add_done_callback(self._loads.discard)

    def _settle(self, name: str, exc: BaseException | None) -> None:
        """Answer the waiters of ``name``'s load: done, or the error they should see."""
        future = self._pending.pop(name, None)
        if future is None or future.done():
            return
        if exc is None:
            future.set_result(None)
            return
        if not isinstance(exc, GatewayError):
            if isinstance(exc, Exception):  # a bug: answer the waiters, keep the worker alive
                log.error("residency: loading %r failed unexpectedly", name, exc_info=exc)
            exc = ModelLoadFailed(f"model '{name}' could not be loaded", retry_after_s=1)
        future.set_exception(exc)
        future.exception()  # waiters may all have given up; nothing is left unretrieved

    async def _prepare(self, entry: Entry) -> bool:
        """Make room for ``entry`` and charge it (state LOADING); ``False`` when it is loaded already."""
        if entry.state is State.LOADED:
            return False
        self._check_fits(entry)
        for victim in await self.evictor.room_for(entry):
            await self.evictor.evict(victim, reason="lru")
        entry.state = State.LOADING
        self.loader.update_charged()
        return True

    async def _finish_load(self, entry: Entry) -> None:
        try:
            await self.loader.load(entry)
        except BaseException as exc:
            self._settle(entry.name, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._settle(entry.name, None)
        finally:
            self._slots.release()

    # -- admin ------------------------------------------------------------------------------------

    def pin(self, model: str, pinned: bool) -> ModelResidency:
        """Pin (never evicted) or unpin a known model."""
        entry = self.loader.entry(model)
        entry.pinned = pinned
        return self.describe(entry)

    async def preload(self, model: str, timeout_s: float) -> ModelResidency:
        """Load ``model`` now, as a first request would (same queue, same checks)."""
        entry = self.loader.entry(model)
        async with self.hold(model, time.monotonic() + timeout_s):
            pass
        return self.describe(entry)

    async def evict(self, model: str) -> ModelResidency:
        """Unload ``model`` now.

        Raises:
            ModelNotReady: it is pinned, has requests in flight, is a step a resident ensemble
                holds, or is not loaded.
        """
        entry = self.loader.entry(model)
        if not self.table.evictable(entry):
            why = (
                "pinned"
                if entry.pinned
                else f"{entry.in_flight} request(s) in flight"
                if entry.in_flight
                else f"a step of {', '.join(sorted(entry.held_by))}"
                if entry.held_by
                else entry.state.value
            )
            raise ModelNotReady(f"model '{model}' cannot be evicted now: {why}", retry_after_s=1)
        await self.evictor.evict(entry, reason="admin")
        return self.describe(entry)

    def describe(self, entry: Entry) -> ModelResidency:
        return ModelResidency(
            entry.name,
            entry.state.value,
            entry.size_bytes,
            entry.measured,
            entry.pinned,
            entry.in_flight,
        )

    def models(self, names: Iterable[str] | None = None) -> list[ModelResidency]:
        """Every known model's residency (of ``names`` only, when given), by name."""
        wanted = set(names) if names is not None else None
        return [
            self.describe(e)
            for n, e in sorted(self.table.entries.items())
            if wanted is None or n in wanted
        ]

    def state(self, model: str) -> ModelResidency | None:
        entry = self.table.entries.get(model)
        return self.describe(entry) if entry is not None else None
