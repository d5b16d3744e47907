"""How fast one peer address may open connections: a token bucket per address, checked at accept.

A client that opens connections in bulk (a flood that ignores Retry-After, a storm of connects and
disconnects) makes the one event loop that also serves every other tenant run the HTTP machinery
for each of them, even when every request is then refused. :class:`AcceptRate` is checked in the
protocol's ``connection_made`` (:mod:`gateway.http.limits`), before any byte is parsed: a peer over
its rate gets a canned 429 and the connection is closed, which costs microseconds.

Microseconds a refusal, but a client that reconnects as soon as it is refused makes thousands a
second: the isolation benchmark's 1,000 idle connections came back 2,700 times a second, on the
loop every tenant shares, and the attacker's own reconnecting took the rest of a small machine. So
with ``max_debt_s`` set, a refused connection costs its address a token too (the debt is bounded by
``max_debt_s``), and :class:`RefusedConnection` answers it only when the address may connect again
(at most ``max_debt_s`` later), leaving it unread meanwhile. A client that waits as told is
answered in milliseconds and never notices; one that keeps coming back waits longer each time,
which is what slows it, at the cost of a file descriptor and a timer per held connection (held
connections are bounded; past the bound they are answered at once, as without a debt).

Each address has a GCRA bucket (one float: the theoretical arrival time of its next connection), so
``burst`` connections may come back to back and then ``rate_per_s`` a second. A bucket that has
refilled says nothing a missing one would not, so it is dropped: the table holds the addresses seen in
the last ``burst / rate_per_s`` seconds, and never more than ``max_peers`` (the least recently seen
go first past it, which at worst hands an address a fresh burst).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from gateway.http.problems import raw_problem_response

__all__ = [
    "DEFAULT_MAX_PEERS",
    "AcceptRate",
    "HeldRefusals",
    "RefusedConnection",
    "accept_rate_answer",
]

#: addresses remembered at most (a float and a string each: a few MB at the cap)
DEFAULT_MAX_PEERS = 65_536
#: refilled buckets dropped per check, from the least recently seen: enough to keep up with arrivals
_SWEEP = 2


class AcceptRate:
    """New connections per peer address: ``burst`` at once, then ``rate_per_s`` a second.

    Args:
        rate_per_s: sustained connections per second from one address; 0 switches the check off.
        burst: connections one address may open back to back.
        max_debt_s: how far past its bucket refused connections may push an address (seconds of
            tokens); 0: refused connections cost nothing.
        max_peers: addresses remembered at most.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_debt_s: float = 0.0,
        max_peers: int = DEFAULT_MAX_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = rate_per_s > 0
        self.max_debt_s = max_debt_s
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
            # Refused: charged too, up to the debt bound (never lowered by it); moved to the end.
            debt_limit = now + self._tolerance + self.max_debt_s
            self._tat[peer] = max(tat, min(tat + self._interval, debt_limit))
            self._sweep(now)
            return wait
        self._tat[peer] = tat + self._interval
        self._sweep(now)
        return 0.0

    def wait_of(self, peer: str) -> float:
        """Seconds until ``peer`` may connect again (0.0: now), without taking anything."""
        tat = self._tat.get(peer)
        return 0.0 if tat is None else max(0.0, tat - self._clock() - self._tolerance)

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


@lru_cache(maxsize=64)
def accept_rate_answer(retry_after_s: int) -> bytes:
    """The canned 429 of a connection over its address's accept rate (built once per Retry-After)."""
    return raw_problem_response(
        429,
        "Too Many Requests",
        "this address opens connections faster than the gateway accepts from one address; retry "
        f"after {retry_after_s} s",
        "",
        {"retry-after": str(retry_after_s)},
    )


@dataclass(eq=False)
class HeldRefusals:
    """The refused connections of one server waiting for their answer (:class:`RefusedConnection`).

    Args:
        rate: the server's accept rate (its ``max_debt_s`` bounds a hold).
        max_held: connections held at most; past it they are answered at once.
        linger_s: how long an answered connection is kept for the client to read its answer.
    """

    rate: AcceptRate
    max_held: int
    linger_s: float
    members: set[RefusedConnection] = field(default_factory=set)


class RefusedConnection:
    """A connection over its address's accept rate, from ``connection_made`` to its close.

    It is answered (the canned 429, then the sending side shut) when its address may connect again:
    at once where that is under a millisecond or ``held.max_held`` connections are held already,
    else after at most ``held.rate.max_debt_s`` with the connection unread meanwhile. Then what the
    client still sends is dropped until it closes, for at most ``held.linger_s`` (closing with its
    request unread would reset the connection before the client reads the answer).
    """

    def __init__(
        self, transport: asyncio.Transport, peer: str, wait: float, held: HeldRefusals
    ) -> None:
        self.transport, self._peer, self._held = transport, peer, held
        loop = asyncio.get_running_loop()
        hold_s = min(wait, held.rate.max_debt_s)
        if hold_s < 0.001 or len(held.members) >= held.max_held:
            self._timer = self._answer(loop)
            return
        transport.pause_reading()
        held.members.add(self)
        self._timer = loop.call_later(hold_s, self._end_hold, loop)

    def _end_hold(self, loop: asyncio.AbstractEventLoop) -> None:
        self._held.members.discard(self)
        if not self.transport.is_closing():
            self.transport.resume_reading()  # read (and dropped) while the client takes the answer
            self._timer = self._answer(loop)

    def _answer(self, loop: asyncio.AbstractEventLoop) -> asyncio.TimerHandle:
        rate = self._held.rate
        self.transport.write(accept_rate_answer(rate.retry_after_s(rate.wait_of(self._peer))))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        return loop.call_later(self._held.linger_s, self.transport.close)

    def eof_received(self) -> None:
        """The client closed its side: it has read the answer, or given up waiting for it."""
        self.transport.close()

    def lost(self) -> None:
        """The connection is gone (the protocol's ``connection_lost``)."""
        self._timer.cancel()
        self._held.members.discard(self)
