"""How a multi-worker gateway shares its clients' connections among its worker processes.

Starts Redis and a gateway with ``WORKERS`` workers (no Triton needed: ``/healthz`` answers without
it), opens ``CONNECTIONS`` keep-alive connections at once (as a client's pool or the load generator
does), and counts the established connections each worker process holds (``ss``). Each round
starts a new gateway. Run from the repository root:

    GATEWAY_DEV_INSECURE=1 PYTHONPATH=$PWD python3 loadtest/probes/worker_balance.py 8 128 5

With one listening socket for all workers (uvicorn's supervisor), asyncio accepts up to the backlog
of pending connections each time a worker wakes: a burst lands in whichever workers wake first, and
a connection stays with the worker that accepted it. The gateway now gives each worker a socket of
its own (``gateway/http/workers.py``); benchmarks/cpu/worker-balance-2026-12-07 has both.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.ports import reserve_port
from serving.redis_process import redis_server


async def _held_per_worker(url: str, port: int, connections: int) -> list[int]:
    """Open ``connections`` connections at the same moment (one client each), count them per worker
    while they are held, then close them."""
    clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(connections)]
    try:
        await asyncio.gather(*(c.get("/healthz") for c in clients))
        return _per_worker(port)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def _per_worker(port: int) -> list[int]:
    """Established connections to ``port`` per server process, most first."""
    listing = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pids = collections.Counter(
        line.split("pid=")[1].split(",")[0] for line in listing.splitlines() if "pid=" in line
    )
    return sorted(pids.values(), reverse=True)


def one_round(workers: int, connections: int) -> list[int]:
    """One gateway's connections per worker (workers holding none are listed as 0)."""
    work = Path(tempfile.mkdtemp(prefix="worker-balance-"))
    with redis_server(work) as redis_url:
        port = reserve_port()
        launch = GatewayLaunch.local(
            port,
            "127.0.0.1:1",
            work / "keys.db",
            args=("--workers", str(workers), "--redis-url", redis_url),
        )
        with start_gateway_process(launch):
            time.sleep(3)  # every worker listening, not just the first to answer /healthz
            counts = asyncio.run(_held_per_worker(launch.url, port, connections))
    return counts + [0] * (workers - len(counts))


def main() -> None:
    workers, connections, rounds = (int(v) for v in sys.argv[1:4])
    print(f"{workers} workers, {connections} connections opened at once; per worker, most first:")
    for number in range(1, rounds + 1):
        counts = one_round(workers, connections)
        print(
            f"round {number}: {counts}  (most {max(counts)}, even share {connections / workers:g})"
        )


if __name__ == "__main__":
    main()
