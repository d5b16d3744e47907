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
  seconds) runs in a task of its own, up to ``max_concurrent_loads`` at once. A footprint is
  measured around a load (the meter before and after, :mod:`gateway.backends.residency_memory`) only
  when no other load or eviction changed Triton's memory meanwhile, so it belongs to that model
  alone; it is remembered in a JSON file, so the next start charges the measured size, not the
  estimate. A load that overlapped others keeps the model's charge as it was (estimate or earlier
  measurement).
- **Eviction** picks victims with :meth:`gateway.backends.residency_policy.ResidencyTable.victims` (least
  recently used, never pinned, never with requests in flight, never a step another resident
  ensemble uses) and only when evicting them makes room (when only requests in flight stand in the
  way, the load waits up to ``drain_timeout_s`` for them to finish); a model bigger than the whole
  budget is
  refused (507) before anything is evicted. Choosing a victim and marking it UNLOADING happen with
  no await in between, so no request can start on a model being evicted. If a measured footprint
  turns out larger than its estimate, older models are evicted after the load until the charges
  fit again.
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
from typing import NoReturn

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.backends.residency_footprints import FootprintBook
from gateway.backends.residency_memory import MemoryMeter
from gateway.backends.residency_policy import (
    Entry,
    ModelResidency,
    ResidencyConfig,
    ResidencyTable,
    State,
    disk_estimate,
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

_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


class _Metrics:
    def __init__(self, registry: CollectorRegistry, budget_bytes: int) -> None:
        self.loads = Counter(
            "gateway_model_loads",
            "Model loads on demand, by outcome",
            ["model", "outcome"],
            registry=registry,
        )
        self.evictions = Counter(
            "gateway_model_evictions",
            "Models evicted, by reason",
            ["model", "reason"],
            registry=registry,
        )
        self.cold_load = Histogram(
            "gateway_model_cold_load_seconds",
            "Time to load a model on demand",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.charged = Gauge(
            "gateway_model_memory_charged_bytes",
            "What resident models are charged against the budget",
            registry=registry,
        )
        self.measured = Gauge(
            "gateway_model_memory_measured_bytes",
            "Triton's memory now, as the residency meter reads it",
            registry=registry,
        )
        self.budget = Gauge(
            "gateway_model_memory_budget_bytes", "The residency memory budget", registry=registry
        )
        self.budget.set(budget_bytes)


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
        self.metrics = _Metrics(registry, config.budget_bytes)
        self._queue: asyncio.Queue[str] = asyncio.Queue(maxsize=config.max_pending_loads)
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._released = asyncio.Event()
        self._footprints = FootprintBook(config.footprints_path)
        self._worker: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(config.max_concurrent_loads)
        self._loads: set[asyncio.Task[None]] = set()
        # Bumped whenever Triton's memory may change (a load starts, a model is evicted): a load
        # whose reading before and after saw the same epoch had Triton's memory to itself.
        self._memory_epoch = 0
        self._loads_in_progress = 0
        #: Triton's memory when the manager started (before any load of its own)
        self.baseline_bytes = 0
        #: Triton's memory at the last reading (start, load or eviction)
        self.measured_bytes = 0

    # -- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Read Triton's index (what is loaded now) and start the load worker."""
        index = await self.repository.index()
        now = time.monotonic()
        for name, info in index.items():
            entry = self._entry(name)
            if info.get("state") == "READY":
                entry.state = State.LOADED
                entry.last_used = now
                entry.pinned = self.config.pin_loaded_at_start
        for name in self.config.pinned:
            if name in self.table.entries:
                self.table.entries[name].pinned = True
        for entry in list(self.table.entries.values()):
            if entry.state is State.LOADED:
                await self._note_steps(entry, before=None)
        self.baseline_bytes = await self.meter.used_bytes()
        self._set_measured(self.baseline_bytes)
        self._update_charged()
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
        entry = self._entry(model)
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
        entry = self._entry(model)
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
                self._released.set()  # a load waiting for room may find it now

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
                f"model '{entry.name}' failed to load {entry.failures} time(s); the next attempt is allowed in "
                f"{entry.retry_at - now:.0f} s",
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
                f"instance's memory budget of {self.table.budget_bytes} bytes allows beside its pinned models",
                field="model",
            )

    # -- the load worker -------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            name = await self._queue.get()
            await self._slots.acquire()
            entry = self._entry(name)
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
        for victim in await self._room_for(entry):
            await self._evict(victim, reason="lru")
        entry.state = State.LOADING
        self._update_charged()
        return True

    async def _finish_load(self, entry: Entry) -> None:
        try:
            await self._load(entry)
        except BaseException as exc:
            self._settle(entry.name, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self._settle(entry.name, None)
        finally:
            self._slots.release()

    async def _load(self, entry: Entry) -> None:
        """Triton's part of a load that :meth:`_prepare` charged, and what follows it."""
        before_loaded = {n for n, e in self.table.entries.items() if e.state is State.LOADED}
        self._memory_epoch += 1
        epoch = self._memory_epoch
        self._loads_in_progress += 1
        alone = self._loads_in_progress == 1
        try:
            before = await self.meter.used_bytes()
            started = time.monotonic()
            try:
                await self.repository.load(entry.name)
            except GatewayError as exc:
                self._load_failed(entry, exc)
            elapsed = time.monotonic() - started
            after = await self.meter.used_bytes()
        except BaseException:
            if entry.state is State.LOADING:  # the meter failed, or the load was cancelled
                entry.state = State.AVAILABLE
                self._update_charged()
            raise
        finally:
            self._loads_in_progress -= 1
        # Alone: no other load in progress at its start, and none started (nor any eviction) since.
        alone = alone and epoch == self._memory_epoch
        entry.state = State.LOADED
        entry.failures = 0
        entry.retry_at = 0.0
        entry.last_used = time.monotonic()
        if alone:
            entry.footprint_bytes = max(0, after - before)
            self._footprints.remember(entry.name, entry.footprint_bytes)
        await self._note_steps(entry, before_loaded)
        self.metrics.loads.labels(entry.name, "loaded").inc()
        self.metrics.cold_load.labels(entry.name).observe(elapsed)
        self._set_measured(after)
        log.info(
            "residency: loaded %r in %.2f s, footprint %s",
            entry.name,
            elapsed,
            f"{entry.footprint_bytes} bytes" if alone else "not measured (other loads overlapped)",
        )
        # The measurement may exceed the estimate it was admitted on: make the charges fit again.
        over = self.table.used_bytes() - self.table.budget_bytes
        if over > 0:
            for victim in self._claim(self.table.victims(0, protect=entry.name) or []):
                await self._evict(victim, reason="measured_over")
        self._update_charged()

    def _load_failed(self, entry: Entry, exc: GatewayError) -> NoReturn:
        entry.state = State.AVAILABLE
        entry.failures += 1
        backoff = min(300.0, self.config.failure_backoff_s * 2 ** (entry.failures - 1))
        entry.retry_at = time.monotonic() + backoff
        self.metrics.loads.labels(entry.name, "failed").inc()
        self._update_charged()
        log.warning(
            "residency: model %r failed to load (%s); next attempt in %.0f s",
            entry.name,
            exc.detail,
            backoff,
        )
        raise ModelLoadFailed(
            f"model '{entry.name}' failed to load: {exc.detail}", retry_after_s=backoff
        ) from exc

    async def _room_for(self, entry: Entry) -> list[Entry]:
        """The victims that make room for ``entry``, claimed (no request starts on them any more).

        When only requests in flight stand in the way, the victims are claimed first and the load
        waits (at most ``drain_timeout_s``) for those requests to finish: they are never dropped.

        Raises:
            ModelNotReady: no room can be made, or the requests in the way did not finish in time.
        """
        victims = self.table.victims(entry.size_bytes, protect=entry.name)
        if victims is not None:
            return self._claim(victims)
        victims = self.table.victims(entry.size_bytes, protect=entry.name, when_idle=True)
        if victims is None:
            raise ModelNotReady(
                f"no room for model '{entry.name}' ({entry.size_bytes} bytes): the budget of "
                f"{self.table.budget_bytes} bytes is held by pinned models and models with requests in flight",
                retry_after_s=1,
            )
        self._claim(victims)
        models = [m for v in victims for m in (v, *self.table.going_with(v))]
        give_up = time.monotonic() + self.config.drain_timeout_s
        while any(m.in_flight for m in models):
            left = give_up - time.monotonic()
            if left <= 0:
                for model in models:
                    model.draining = False
                raise ModelNotReady(
                    f"no room for model '{entry.name}' yet: requests to "
                    f"{', '.join(m.name for m in models if m.in_flight)} did not finish within "
                    f"{self.config.drain_timeout_s:g} s",
                    retry_after_s=1,
                )
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), left)
        return victims

    def _claim(self, victims: list[Entry]) -> list[Entry]:
        """Mark ``victims`` (and the steps that go with them) draining: from now on no request starts
        on them, so evicting them one after another (with awaits between) drops nothing."""
        for victim in victims:
            for model in (victim, *self.table.going_with(victim)):
                model.draining = True
        return victims

    async def _note_steps(self, entry: Entry, before: set[str] | None) -> None:
        """Record an ensemble's steps: holders, and which ones its load carried in (those not loaded
        ``before`` it; ``None``: loaded before the gateway started, so none is known to be carried)."""
        try:
            entry.steps = await self.repository.steps(entry.name)
        except GatewayError as exc:
            log.warning("residency: could not read %r's configuration: %s", entry.name, exc.detail)
            return
        for name in entry.steps:
            step = self._entry(name)
            step.held_by.add(entry.name)
            if step.state is not State.LOADED:
                step.state = State.LOADED
                step.last_used = time.monotonic()
            if before is not None and name not in before:
                step.carried = True

    async def _evict(self, entry: Entry, reason: str) -> None:
        going = self.table.going_with(entry)
        # Claimed (draining) or checked idle with no await since: no request can start on these now.
        for model in (entry, *going):
            model.state = State.UNLOADING
        self._memory_epoch += 1
        for model in (entry, *going):
            try:
                await self.repository.unload(model.name)
            except GatewayError as exc:
                log.warning("residency: unloading %r failed: %s", model.name, exc.detail)
            model.state = State.AVAILABLE
            model.carried = False
            model.draining = False
            self.metrics.evictions.labels(model.name, reason).inc()
        for name in entry.steps:
            step = self.table.entries.get(name)
            if step is not None:
                step.held_by.discard(entry.name)
        self._set_measured(await self.meter.used_bytes())
        self._update_charged()
        log.info(
            "residency: evicted %r (%s)%s",
            entry.name,
            reason,
            f" with {', '.join(s.name for s in going)}" if going else "",
        )

    # -- admin ------------------------------------------------------------------------------------

    def pin(self, model: str, pinned: bool) -> ModelResidency:
        """Pin (never evicted) or unpin a known model."""
        entry = self._entry(model)
        entry.pinned = pinned
        return self.describe(entry)

    async def preload(self, model: str, timeout_s: float) -> ModelResidency:
        """Load ``model`` now, as a first request would (same queue, same checks)."""
        entry = self._entry(model)
        async with self.hold(model, time.monotonic() + timeout_s):
            pass
        return self.describe(entry)

    async def evict(self, model: str) -> ModelResidency:
        """Unload ``model`` now.

        Raises:
            ModelNotReady: it is pinned, has requests in flight, is a step a resident ensemble
                holds, or is not loaded.
        """
        entry = self._entry(model)
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
        await self._evict(entry, reason="admin")
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

    # -- footprints ---------------------------------------------------------------------------------

    def _entry(self, name: str) -> Entry:
        entry = self.table.entries.get(name)
        if entry is not None:
            return entry
        entry = self.table.get(name, self._estimate(name))
        remembered = self._footprints.get(name)
        if remembered is not None:
            entry.footprint_bytes = remembered
        if name in self.config.pinned:
            entry.pinned = True
        return entry

    def _estimate(self, name: str) -> int:
        if self.config.repository is not None:
            estimate = disk_estimate(self.config.repository / name)
            if estimate is not None:
                return estimate
        return self.config.default_estimate_bytes

    def _set_measured(self, value: int) -> None:
        self.measured_bytes = value
        self.metrics.measured.set(value)

    def _update_charged(self) -> None:
        self.metrics.charged.set(self.table.used_bytes())
