"""Making room: which resident models go, claimed so no request starts on them, then unloaded.

The residency manager (:mod:`gateway.backends.residency`) decides *when* room is needed; this module
decides nothing about order (:meth:`gateway.backends.residency_policy.ResidencyTable.victims` does)
and only carries the choice out without dropping a request:

- Victims are *claimed* (marked draining) the moment they are chosen, with no await in between, so
  no request can start on them while earlier victims unload.
- When only requests in flight stand in the way, the claimed victims wait (at most
  ``drain_timeout_s``) for those requests to finish; they are never cut off.
- An ensemble goes with the steps its load carried in, and releases the steps it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from gateway.backends.residency_memory import MemoryMeter
from gateway.backends.residency_metrics import MemoryReadings, ResidencyMetrics
from gateway.backends.residency_policy import Entry, ResidencyTable, State
from gateway.backends.residency_triton import TritonRepository
from gateway.errors import GatewayError, ModelNotReady

__all__ = ["Evictor"]

log = logging.getLogger(__name__)


# eq=False: an evictor is one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class Evictor:
    """Claims and unloads victims for the residency manager.

    Args:
        table: the residency table (shared with the manager).
        repository: Triton's repository extension.
        meter: reads Triton's memory after an eviction.
        metrics: where evictions and charges are counted.
        readings: Triton's memory as last read (shared with the manager).
        drain_timeout_s: how long a load waits for requests in flight on its victims.
    """

    table: ResidencyTable
    repository: TritonRepository
    meter: MemoryMeter
    metrics: ResidencyMetrics
    readings: MemoryReadings
    drain_timeout_s: float
    _released: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def released(self) -> None:
        """A model's last request in flight finished: a load waiting for room may find it now."""
        self._released.set()

    async def room_for(self, entry: Entry) -> list[Entry]:
        """The victims that make room for ``entry``, claimed (no request starts on them any more).

        Raises:
            ModelNotReady: no room can be made, or the requests in the way did not finish in time.
        """
        victims = self.table.victims(entry.size_bytes, protect=entry.name)
        if victims is not None:
            return self.claim(victims)
        victims = self.table.victims(entry.size_bytes, protect=entry.name, when_idle=True)
        if victims is None:
            raise ModelNotReady(
                f"no room for model '{entry.name}' ({entry.size_bytes} bytes): the budget of "
                f"{self.table.budget_bytes} bytes is held by pinned models and models with "
                "requests in flight",
                retry_after_s=1,
            )
        self.claim(victims)
        models = [m for v in victims for m in (v, *self.table.going_with(v))]
        give_up = time.monotonic() + self.drain_timeout_s
        while any(m.in_flight for m in models):
            left = give_up - time.monotonic()
            if left <= 0:
                for model in models:
                    model.draining = False
                raise ModelNotReady(
                    f"no room for model '{entry.name}' yet: requests to "
                    f"{', '.join(m.name for m in models if m.in_flight)} did not finish within "
                    f"{self.drain_timeout_s:g} s",
                    retry_after_s=1,
                )
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), left)
        return victims

    def claim(self, victims: list[Entry]) -> list[Entry]:
        """Mark ``victims`` (and the steps that go with them) draining: from now on no request starts
        on them, so evicting them one after another (with awaits between) drops nothing."""
        for victim in victims:
            for model in (victim, *self.table.going_with(victim)):
                model.draining = True
        return victims

    async def evict(self, entry: Entry, reason: str) -> None:
        """Unload ``entry`` and the steps that go with it (claimed, or checked idle just now)."""
        going = self.table.going_with(entry)
        # Claimed (draining) or checked idle with no await since: no request can start on these now.
        for model in (entry, *going):
            model.state = State.UNLOADING
        self.readings.changing()
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
        self.readings.record(await self.meter.used_bytes())
        self.metrics.charged.set(self.table.used_bytes())
        log.info(
            "residency: evicted %r (%s)%s",
            entry.name,
            reason,
            f" with {', '.join(s.name for s in going)}" if going else "",
        )
