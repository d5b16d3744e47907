"""How fast one peer address may open connections: a token bucket per address, checked at accept.

A client that opens connections in bulk (a flood that ignores Retry-After, a storm of connects and
disconnects) makes the one event loop that also serves every other tenant run the HTTP machinery
for each of them, even when every request is then refused. :class:`AcceptRate` is checked in the
protocol's ``connection_made`` (:mod:`gateway.http.limits`), before any byte is parsed: a peer over
its rate gets a canned 429 and the connection is closed, which costs microseconds.

Each address has a GCRA bucket (one float: the theoretical arrival time of its next connection), so
``burst`` connections may come back to back and then ``rate_per_s`` a second. A bucket that has
refilled says nothing a missing one would not, so it is dropped: the table holds the addresses seen in
the last ``burst / rate_per_s`` seconds, and never more than ``max_peers`` (the least recently seen
go first past it, which at worst hands an address a fresh burst).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["DEFAULT_MAX_PEERS", "AcceptRate"]

#: addresses remembered at most (a float and a string each: a few MB at the cap)
DEFAULT_MAX_PEERS = 65_536
#: refilled buckets dropped per check, from the least recently seen: enough to keep up with arrivals
_SWEEP = 2


class AcceptRate:
    """New connections per peer address: ``burst`` at once, then ``rate_per_s`` a second.

    Args:
        rate_per_s: sustained connections per second from one address; 0 switches the check off.
        burst: connections one address may open back to back.
        max_peers: addresses remembered at most.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_peers: int = DEFAULT_MAX_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = rate_per_s > 0
        self._interval = 1.0 / rate_per_s if self.enabled else 0.0
        # How far ahead of now an address's next arrival may be and still be admitted.
        self._tolerance = (max(burst, 1) - 1) * self._interval
        self._max_peers = max_peers
        self._clock = clock
        # address -> theoretical arrival time; insertion order is recency (an address is re-inserted
        # on each check), so the first entries are the least recently seen.
        self._tat: dict[str, float] = {}

    def admit(self, peer: str) -> float:
        """Take a connection from ``peer``'s bucket.

        Returns:
            0.0 when the connection may be served, else the seconds until ``peer`` may connect again.
        """
        if not self.enabled:
            return 0.0
        now = self._clock()
        tat = max(self._tat.pop(peer, now), now)
        wait = tat - now - self._tolerance
        if wait > 0:
            self._tat[peer] = tat  # refused: the bucket is not charged, only moved to the end
            self._sweep(now)
            return wait
        self._tat[peer] = tat + self._interval
        self._sweep(now)
        return 0.0

    def retry_after_s(self, wait: float) -> int:
        """Whole seconds for a ``Retry-After`` header (at least 1)."""
        return max(1, math.ceil(wait))

    def _sweep(self, now: float) -> None:
        for _ in range(_SWEEP):
            if not self._tat:
                return
            oldest = next(iter(self._tat))
            if self._tat[oldest] > now and len(self._tat) <= self._max_peers:
                return  # not yet refilled, and there is room
            del self._tat[oldest]
        while len(self._tat) > self._max_peers:
            del self._tat[next(iter(self._tat))]

    def __len__(self) -> int:
        return len(self._tat)
