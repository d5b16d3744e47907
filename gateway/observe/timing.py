"""Where a request's time goes inside the gateway, stage by stage.

Each admitted request keeps the wall time of its stages:

==============  ==================================================================================
``auth``        checking the credential (a key-store lookup only on a cache miss)
``admit``       name, scope, the caller's rate limits (one Redis round trip with a shared store) and
                the model's existence
``parse``       checking a KServe v2 body (re-encoding it for Triton is part of ``upstream``)
``upstream``    waiting on Triton, from the first byte sent to the last byte of its answer
==============  ==================================================================================

The rest of the gateway's time (routing, reading the body, FastAPI's validation, encoding the
answer) is the request's total minus these. The stages go back to the client as a W3C
``Server-Timing`` header (``auth;dur=<ms>, ..., total;dur=<ms>``; browsers' developer tools show
it, ``curl -i`` prints it), and into the Prometheus histogram
``gateway_stage_duration_seconds``, so an operator (or the benchmark) can tell a slow Triton from
a slow Redis or a busy event loop: what a client waits beyond the gateway's ``total`` is time spent
before the gateway's code runs (the connection, HTTP parsing, the event loop's backlog).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["LOOP_LAG_INTERVAL_S", "STAGES", "StageTimes", "watch_event_loop"]

#: ``load``: waiting for the model to be loaded on demand (:mod:`gateway.backends.residency`), only
#: when it was not
STAGES = ("auth", "admit", "load", "parse", "upstream")
#: how often :func:`watch_event_loop` samples the loop's lag
LOOP_LAG_INTERVAL_S = 0.05


@dataclass
class StageTimes:
    """Seconds spent in each named stage of one request (a stage entered twice adds up)."""

    seconds: dict[str, float] = field(default_factory=dict)

    def stage(self, name: str) -> _Stage:
        """Time the block as stage ``name`` (one of :data:`STAGES`), whether it returns or raises."""
        return _Stage(self.seconds, name)

    def get(self, name: str) -> float:
        """The seconds of stage ``name`` (0 when the request never entered it)."""
        return self.seconds.get(name, 0.0)

    def header(self, total_s: float) -> str:
        """The ``Server-Timing`` value: each stage entered, then ``total``, in milliseconds."""
        parts = [
            f"{name};dur={self.seconds[name] * 1000:.3f}" for name in STAGES if name in self.seconds
        ]
        parts.append(f"total;dur={total_s * 1000:.3f}")
        return ", ".join(parts)


class _Stage:
    """The context manager of :meth:`StageTimes.stage`: a plain class, because a generator-based one
    (``@contextmanager``) costs several times more and a request enters four or five stages."""

    __slots__ = ("_name", "_seconds", "_started")

    def __init__(self, seconds: dict[str, float], name: str) -> None:
        self._seconds = seconds
        self._name = name
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._started
        self._seconds[self._name] = self._seconds.get(self._name, 0.0) + elapsed


async def watch_event_loop(
    observe: Callable[[float], None], interval_s: float = LOOP_LAG_INTERVAL_S
) -> None:
    """Pass the running event loop's lag to ``observe`` every ``interval_s`` until cancelled (a
    lifespan task; the gateway observes it into ``gateway_event_loop_lag_seconds``).

    A request crosses its worker's loop several times (its body, the rate limiter, Triton's answer);
    when the loop is backed up each crossing waits, with no CPU to show for it in the stages above.
    A sleep that wakes late by ``x`` measures that wait.
    """
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - started - interval_s))
