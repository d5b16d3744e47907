"""The garbage collector's pauses in a worker process, and the start-up objects it need not walk.

A collection stops the worker's event loop: every request in flight on that worker waits it out.
A full (generation 2) collection walks every tracked object, and most of them are the modules, the
app and its routes built at start-up, which live as long as the process: 56-68 ms in a process that
has built the gateway's app, on a 2-core EPYC (``inferctl bench gateway-profile --no-profile``
prints it; benchmarks/cpu/gateway-gc-2026-12-07). Full collections are rare while serving (none in
47 s at 300 requests/s there), but each one stalls a worker for that long.
:func:`freeze_startup_objects` moves the start-up objects out of the collector's sight
(``gc.freeze``, as Instagram's Django fleet does), so a full collection walks only what serving
created.

:class:`GcPauses` times every collection into ``gateway_gc_pause_seconds{generation}``, so a latency
tail can be told apart from the collector's. Its callback runs inside the collector, at any
allocation, possibly while the same thread holds prometheus_client's lock (one lock for all metrics
in multiprocess mode): it only appends to a deque, and a lifespan task observes the pauses.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["OBSERVE_INTERVAL_S", "GcPauses", "freeze_startup_objects"]

#: how often a worker hands its recorded pauses to the histogram (a scrape may lag by this much)
OBSERVE_INTERVAL_S = 1.0


def freeze_startup_objects() -> int:
    """Collect once, then exempt every object alive now from later collections (``gc.freeze``).

    For a server process once its app is built: what is alive then lives as long as the process.
    Not for a process that builds many apps (the test suite): their garbage would never be
    collected.

    Returns:
        How many objects are frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Every collection's generation and duration, kept until :meth:`drain` takes them.

    Args:
        keep: pauses kept between drains (the oldest go first: a drain every second sees them all).
    """

    def __init__(self, keep: int = 4096) -> None:
        self._pauses: collections.deque[tuple[int, float]] = collections.deque(maxlen=keep)
        self._started = 0.0

    def install(self) -> None:
        """Start timing this process's collections (once; :meth:`remove` stops)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._pauses.append((int(info["generation"]), time.perf_counter() - self._started))
            self._started = 0.0

    def drain(self) -> list[tuple[int, float]]:
        """The (generation, seconds) of each collection since the last drain, oldest first."""
        taken: list[tuple[int, float]] = []
        while True:
            try:
                taken.append(self._pauses.popleft())
            except IndexError:
                return taken

    async def observe_forever(
        self, observe: Callable[[int, float], None], interval_s: float = OBSERVE_INTERVAL_S
    ) -> None:
        """Hand each pause to ``observe(generation, seconds)`` every ``interval_s`` until
        cancelled, and the last ones then."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                for generation, seconds in self.drain():
                    observe(generation, seconds)
        finally:
            for generation, seconds in self.drain():
                observe(generation, seconds)
