"""Triton's part of a load: the model's footprint measured (when it ran alone), remembered, its
ensemble steps noted, a failure backed off.

The residency manager (:mod:`gateway.backends.residency`) has already made room and charged the model
(state LOADING) before :meth:`Loader.load` runs; several loads may run at once. A footprint is the
meter's reading after the load minus the one before, and is kept only when no other load started
and nothing was evicted in between (:class:`gateway.backends.residency_metrics.MemoryReadings`), so it
belongs to that model alone. It is remembered in a JSON file, so the next start charges the measured
size, not the estimate; a load that overlapped others keeps the charge it had.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NoReturn

from gateway.backends.residency_eviction import Evictor
from gateway.backends.residency_footprints import FootprintBook
from gateway.backends.residency_memory import MemoryMeter
from gateway.backends.residency_metrics import MemoryReadings, ResidencyMetrics
from gateway.backends.residency_policy import (
    Entry,
    ResidencyConfig,
    ResidencyTable,
    State,
    disk_estimate,
)
from gateway.backends.residency_triton import TritonRepository
from gateway.errors import GatewayError, ModelLoadFailed

__all__ = ["Loader"]

log = logging.getLogger(__name__)


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class Loader:
    """Loads charged models into Triton and keeps what each one costs.

    Args:
        config: the residency behaviour (estimates, footprint file, backoff, pinned models).
        table: the residency table (shared with the manager).
        repository: Triton's repository extension.
        meter: reads Triton's memory.
        evictor: evicts when a measured footprint turns out larger than its estimate.
    """

    config: ResidencyConfig
    table: ResidencyTable
    repository: TritonRepository
    meter: MemoryMeter
    evictor: Evictor

    def __post_init__(self) -> None:
        self.metrics: ResidencyMetrics = self.evictor.metrics
        self.readings: MemoryReadings = self.evictor.readings
        self._footprints = FootprintBook(self.config.footprints_path)
        self._in_progress = 0

    def entry(self, name: str) -> Entry:
        """The table's entry for ``name``, made on first sight with its remembered footprint."""
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

    async def load(self, entry: Entry) -> None:
        """Triton's part of a load the manager charged, and what follows it.

        Raises:
            ModelLoadFailed: Triton refused or failed the load (the model backs off).
        """
        before_loaded = {n for n, e in self.table.entries.items() if e.state is State.LOADED}
        epoch = self.readings.changing()
        self._in_progress += 1
        alone = self._in_progress == 1
        try:
            before = await self.meter.used_bytes()
            started = time.monotonic()
            try:
                await self.repository.load(entry.name)
            except GatewayError as exc:
                self._failed(entry, exc)
            elapsed = time.monotonic() - started
            after = await self.meter.used_bytes()
        except BaseException:
            if entry.state is State.LOADING:  # the meter failed, or the load was cancelled
                entry.state = State.AVAILABLE
                self.update_charged()
            raise
        finally:
            self._in_progress -= 1
        # Alone: no other load in progress at its start, and none started (nor any eviction) since.
        alone = alone and epoch == self.readings.epoch
        entry.state = State.LOADED
        entry.failures = 0
        entry.retry_at = 0.0
        entry.last_used = time.monotonic()
        if alone:
            entry.footprint_bytes = max(0, after - before)
            self._footprints.remember(entry.name, entry.footprint_bytes)
        await self.note_steps(entry, before_loaded)
        self.metrics.loads.labels(entry.name, "loaded").inc()
        self.metrics.cold_load.labels(entry.name).observe(elapsed)
        self.readings.record(after)
        log.info(
            "residency: loaded %r in %.2f s, footprint %s",
            entry.name,
            elapsed,
            f"{entry.footprint_bytes} bytes" if alone else "not measured (other loads overlapped)",
        )
        # The measurement may exceed the estimate it was admitted on: make the charges fit again.
        over = self.table.used_bytes() - self.table.budget_bytes
        if over > 0:
            for victim in self.evictor.claim(self.table.victims(0, protect=entry.name) or []):
                await self.evictor.evict(victim, reason="measured_over")
        self.update_charged()

    def _failed(self, entry: Entry, exc: GatewayError) -> NoReturn:
        entry.state = State.AVAILABLE
        entry.failures += 1
        backoff = min(300.0, self.config.failure_backoff_s * 2 ** (entry.failures - 1))
        entry.retry_at = time.monotonic() + backoff
        self.metrics.loads.labels(entry.name, "failed").inc()
        self.update_charged()
        log.warning(
            "residency: model %r failed to load (%s); next attempt in %.0f s",
            entry.name,
            exc.detail,
            backoff,
        )
        raise ModelLoadFailed(
            f"model '{entry.name}' failed to load: {exc.detail}", retry_after_s=backoff
        ) from exc

    async def note_steps(self, entry: Entry, before: set[str] | None) -> None:
        """Record an ensemble's steps: holders, and which ones its load carried in (those not loaded
        ``before`` it; ``None``: loaded before the gateway started, so none is known to be carried)."""
        try:
            entry.steps = await self.repository.steps(entry.name)
        except GatewayError as exc:
            log.warning("residency: could not read %r's configuration: %s", entry.name, exc.detail)
            return
        for name in entry.steps:
            step = self.entry(name)
            step.held_by.add(entry.name)
            if step.state is not State.LOADED:
                step.state = State.LOADED
                step.last_used = time.monotonic()
            if before is not None and name not in before:
                step.carried = True

    def update_charged(self) -> None:
        self.metrics.charged.set(self.table.used_bytes())
