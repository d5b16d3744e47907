"""``python -m loadtest._profiled_gateway PROFILE [gateway options]``: the gateway under cProfile.

Used by :func:`loadtest.isolation_stack.platform` for :mod:`loadtest.gateway_profile`. uvicorn answers
SIGTERM with a graceful shutdown and then raises the signal again with the handler that was there
before it started, so that handler here turns it into ``SystemExit``: the statistics are written on
the way out (``python -m cProfile`` would die of the re-raised signal without writing them). Times are the
event loop thread's CPU time (worker threads, e.g. big bodies parsed off the loop, are not seen).
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from collections.abc import Sequence


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    profile_to, gateway_args = args[0], args[1:]
    signal.signal(signal.SIGTERM, _exit)
    from gateway.http.server import main as gateway_main

    # CPU time of this thread (the event loop's), not wall time: on a busy machine wall time charges
    # a function for every preemption, and a socket write for the peer it wakes.
    profiler = cProfile.Profile(time.thread_time)
    try:
        profiler.enable()
        return gateway_main(gateway_args)
    except SystemExit:
        return 0
    finally:
        profiler.disable()
        profiler.dump_stats(profile_to)


if __name__ == "__main__":
    raise SystemExit(main())
