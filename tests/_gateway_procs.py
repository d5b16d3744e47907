"""Real processes for tests that drive the gateway: gateway subprocesses, redis-server, 127.0.0.1 only.

Shared by ``tests/gateway/conftest.py`` and ``tests/reliability/conftest.py`` (``tests/`` is on
``sys.path`` because ``tests/conftest.py`` is loaded first), so both start processes the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from serving.launcher import free_port

__all__ = [
    "ADMIN_TOKEN",
    "TEST_TIERS",
    "GatewayProcess",
    "RedisProcess",
    "start_gateway",
    "start_redis",
    "tiny_request",
]

ROOT = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "test-admin-token-5f1c9e0b7a"
#: tiers the tests use: "tiny" makes the shared-limit test independent of how long it takes
#: (one token a minute), "unlimited" keeps the other tests clear of rate limiting.
TEST_TIERS = {
    "free": {"per_minute": 10, "burst": 5},
    "tiny": {"per_minute": 1, "burst": 4},
    "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
}
_START_TIMEOUT_S = 30.0


@dataclass
class GatewayProcess:
    """A real gateway subprocess (``python -m gateway``)."""

    url: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_gateway(workdir: Path, triton_http_url: str, **settings: object) -> GatewayProcess:
    """Start a gateway subprocess and wait until it answers ``/healthz``.

    Args:
        workdir: where its key database and log go.
        triton_http_url: Triton's host:port.
        settings: GatewaySettings fields (``tier_limits`` etc. as Python values).

    Returns:
        The running gateway.
    """
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    values: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "triton_http_url": triton_http_url,
        "keys_db": workdir / "keys.sqlite3",
        "admin_token": ADMIN_TOKEN,
        "tier_limits": TEST_TIERS,
        "triton_stats_interval_s": 0.5,
        "log_level": "info",
    }
    values.update(settings)
    for key, value in values.items():
        env[f"GATEWAY_{key.upper()}"] = json.dumps(value) if isinstance(value, dict | list) else str(value)
    log_path = workdir / f"gateway-{port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway"], cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    gateway = GatewayProcess(url=f"http://127.0.0.1:{port}", env=env, log_path=log_path, process=process)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{gateway.log()[-3000:]}")
        try:
            if httpx.get(f"{gateway.url}/healthz", timeout=1.0).status_code == 200:
                return gateway
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            gateway.stop()
            raise RuntimeError(f"gateway did not come up in {_START_TIMEOUT_S} s:\n{gateway.log()[-3000:]}")
        time.sleep(0.1)


@dataclass
class RedisProcess:
    """A real ``redis-server`` on 127.0.0.1, no persistence; can be stopped and started on its port."""

    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: run `./run test` (it installs it) or `apt-get install redis-server`"
            )
        self.process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.RedisError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        self.stop()
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_redis(workdir: Path) -> RedisProcess:
    """Start a real redis-server on a free port and wait until it answers PING."""
    return RedisProcess(workdir).start()


def tiny_request(rows: int = 1) -> dict[str, object]:
    """A KServe v2 JSON body for ``tiny_linear``."""
    return {
        "inputs": [
            {"name": "input", "shape": [rows, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0] * rows}
        ]
    }
