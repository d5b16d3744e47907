"""Keeping each process's caches true to the shared store: a version check every few hundred ms.

Every replica and worker caches verified API keys and holds the canary weights in memory, so the
hot path never waits on Redis for them. Every change to either bumps a version counter in the same
Redis transaction (:mod:`gateway.tenancy.redis_state`). :class:`StateSync` reads both counters in one
``MGET`` every ``state_sync_interval_s`` (default 0.2 s) and, when one moved, drops every cached key
or reloads the weights. A revocation, rotation or weight change made through any replica therefore
applies on every other one within one interval plus a Redis round trip (measured by
``python -m loadtest.propagation``).

Why polling rather than pub/sub: a subscriber that silently loses its connection misses messages
and cannot tell; a counter read either succeeds, and is then complete, or fails visibly. The cost
is one ``MGET`` per process per interval.

While Redis cannot be read, nothing is invalidated: cached keys keep working for at most
``key_cache_ttl_s`` after they were fetched (then they need Redis again), and the weights stay as
they were. After an outage both caches are dropped and reloaded, since changes may have been
missed (a restarted Redis without persistence even restarts its counters).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import StateStoreUnavailable
from gateway.tenancy.keys import KeyStoreUnavailable
from gateway.tenancy.redis_state import StateVersions
from gateway.tenancy.traffic import TrafficSplit

__all__ = ["StateSync"]

log = logging.getLogger(__name__)


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class StateSync:
    """Polls the version counters and applies what moved.

    Args:
        read_versions: blocking call returning the current counters (run in a thread).
        drop_keys: empties this process's API-key cache.
        traffic: this process's canary weights (backed by the shared store).
        interval_s: seconds between checks.
    """

    read_versions: Callable[[], StateVersions]
    drop_keys: Callable[[], None]
    traffic: TrafficSplit
    interval_s: float
    seen: StateVersions | None = field(default=None, init=False)
    #: monotonic time of the last complete check
    last_ok: float | None = field(default=None, init=False)
    # for one log line per change, not one per check
    _healthy: bool | None = field(default=None, init=False)

    async def refresh(self) -> bool:
        """One check; ``True`` when it completed (the caches now match the store as of this check)."""
        try:
            current = await asyncio.to_thread(self.read_versions)
            if self.seen is None or current.keys != self.seen.keys:
                self.drop_keys()
            if self.seen is None or current.traffic != self.seen.traffic:
                await self.traffic.reload()
            await self.traffic.flush()  # canary outcomes counted here since the last check
        except (KeyStoreUnavailable, StateStoreUnavailable) as exc:
            if self._healthy is not False:
                log.warning(
                    "shared state: Redis unreachable (%s); caches kept until it answers", exc
                )
            self._healthy = False
            self.seen = None  # after the outage: drop and reload everything
            return False
        if self._healthy is not True:
            log.info(
                "shared state: in sync (keys v%d, canary weights v%d)",
                current.keys,
                current.traffic,
            )
        self._healthy = True
        self.seen = current
        self.last_ok = time.monotonic()
        return True

    async def run(self) -> None:
        """Check forever (cancelled at shutdown)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.refresh()
