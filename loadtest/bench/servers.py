"""The servers the side-by-side benchmark compares with Triton: the gateway and the naive baseline.

Both run as child processes on reserved ports (:mod:`serving.processes`, :mod:`serving.ports`); one
that does not start fails the benchmark with its log, never a silently skipped configuration.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from loadtest.bench.settings import DEFAULT_MODEL
from loadtest.loadgen.targets import HttpTarget
from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.launcher import TritonPorts, TritonServer, TritonStartError
from serving.ports import reserve_port
from serving.processes import ManagedProcess, child_env, python_module
from serving.redis_process import redis_server

__all__ = [
    "BenchGateway",
    "gateway_server",
    "naive_embedding_server",
    "naive_server",
    "naive_target",
    "start_triton",
]

_BENCH_TIER = "loadtest-bench"


@contextlib.contextmanager
def naive_server(
    device: str, precision: str, workdir: Path, model: str = DEFAULT_MODEL, threads: int = 0
) -> Iterator[str]:
    """Start :mod:`loadtest.naive_server` on a reserved port (``threads`` > 0: that many torch intra-op
    threads, else PyTorch's default); yields its base URL."""
    arguments = ("--model", model, "--device", device, "--precision", precision)
    with _naive("naive server", workdir / "naive_server.log", *arguments, threads=threads) as url:
        yield url


@contextlib.contextmanager
def naive_embedding_server(device: str, workdir: Path, threads: int = 0) -> Iterator[str]:
    """Start :mod:`loadtest.naive_server` serving sentence-transformers' ``encode``; yields its base URL."""
    with _naive(
        "sentence-transformers server",
        workdir / f"naive_embeddings_{device}.log",
        *("--task", "embeddings", "--device", device),
        threads=threads,
    ) as url:
        yield url


def naive_target(base_url: str, images: np.ndarray) -> HttpTarget:
    """The naive server's ``/predict``: one image a request, its raw tensor bytes, in turn."""
    return HttpTarget(
        url=f"{base_url}/predict",
        name="naive",
        requests=tuple(
            (images[i : i + 1].tobytes(), {"Content-Type": "application/octet-stream"})
            for i in range(len(images))
        ),
    )


@contextlib.contextmanager
def _naive(name: str, log_path: Path, *arguments: str, threads: int) -> Iterator[str]:
    """:mod:`loadtest.naive_server` with ``arguments`` on a reserved port, healthy; yields its URL."""
    port = reserve_port()
    command = python_module(
        "loadtest.naive_server",
        *("--host", "127.0.0.1", "--port", str(port)),
        *arguments,
        *("--threads", str(threads)),
    )
    with ManagedProcess(command, name=name, log_path=log_path, env=child_env()) as process:
        process.wait_http(f"http://127.0.0.1:{port}/healthz", 300, expect=b'"ok"')
        yield f"http://127.0.0.1:{port}"


class BenchGateway(NamedTuple):
    """A gateway started for a benchmark: its base URL, a client key, and the ``/metrics`` credential."""

    url: str
    key: str
    metrics_token: str


@contextlib.contextmanager
def gateway_server(triton_http_url: str, workdir: Path, workers: int = 1) -> Iterator[BenchGateway]:
    """Start the real gateway as a subprocess with a fresh API key and metrics token.

    The key's tier has limits far above the offered load, so the benchmark measures the gateway's
    cost, not its rate limiter, and the first priority level, the one the direct rows ask for, so
    both paths meet the same Triton queue; the in-flight bound is raised above the largest
    concurrency.
    ``workers`` > 1 runs that many gateway processes on one port, sharing state through a Redis
    started for the run (``gateway --workers``).
    """
    with contextlib.ExitStack() as stack:
        extra = {
            "GATEWAY_TIER_LIMITS": json.dumps(
                {
                    _BENCH_TIER: {"per_minute": 1e9, "burst": 1_000_000, "priority": 1},
                    "free": {"per_minute": 10, "burst": 5},
                }
            ),
            "GATEWAY_MAX_IN_FLIGHT_PER_MODEL": "4096",
            "GATEWAY_LOG_LEVEL": "warning",
            "GATEWAY_METRICS_TOKEN": secrets.token_urlsafe(24),
            # unused here, but the gateway refuses to serve without one
            "GATEWAY_ADMIN_TOKEN": secrets.token_urlsafe(32),
        }
        keys_db = workdir / "gateway_keys.sqlite3"
        options: tuple[str, ...] = ()
        if workers > 1:
            extra["GATEWAY_REDIS_URL"] = stack.enter_context(redis_server(workdir))
            options = ("--workers", str(workers))
        _, key = _create_key(keys_db, extra.get("GATEWAY_REDIS_URL"))
        port = reserve_port()
        launch = GatewayLaunch.local(
            port,
            triton_http_url,
            keys_db,
            env=child_env(extra),
            log_path=workdir / "gateway.log",
            args=options,
        )
        stack.enter_context(start_gateway_process(launch))
        yield BenchGateway(f"http://127.0.0.1:{port}", key, extra["GATEWAY_METRICS_TOKEN"])


def _create_key(keys_db: Path, redis_url: str | None) -> tuple[str, str]:
    """A high-limit key in the store the gateway reads: SQLite alone, or Redis for several workers."""
    if redis_url is None:
        from gateway.tenancy.keys_sqlite import SqliteKeyStore

        return SqliteKeyStore(keys_db).create("loadtest-bench", ["*"], _BENCH_TIER)
    from gateway.tenancy.redis_state import RedisKeyStore  # the store of gateway --workers

    return RedisKeyStore(redis_url).create("loadtest-bench", ["*"], _BENCH_TIER)


def start_triton(repository: Path, ports: TritonPorts, python: str | None) -> TritonServer:
    """Triton on ``ports``; once more on fresh ports if one was taken meanwhile (seen once on a GPU host,
    cause not found: what listened then is printed for the next person to look)."""
    server = TritonServer(repository, ports=ports, python=python, startup_timeout_s=300)
    try:
        return server.start()
    except TritonStartError as exc:
        if "already in use" not in str(exc):
            raise
        import subprocess

        listing = subprocess.run(
            ["ss", "-tanp"], capture_output=True, text=True, check=False
        ).stdout
        print(f"{exc}; listening and connected sockets then:\n{listing}", flush=True)
        server = TritonServer(
            repository, ports=TritonPorts.free(), python=python, startup_timeout_s=300
        )
        return server.start()
