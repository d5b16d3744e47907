"""Fixtures for the gateway's tests: real processes, free ports, 127.0.0.1 only.

- ``tiny_triton``: the real Triton binary serving :mod:`_tiny_repo`'s fast models (session).
- ``redis_url``: a real ``redis-server`` on a free port, no persistence (session).
- ``gateway_factory``: starts ``python -m gateway`` subprocesses with given settings and waits until
  they answer ``/healthz``; every one is stopped at the end of the session.
- ``gateway``: one shared gateway in front of ``tiny_triton`` with an admin token (session).
- ``admin``: creates keys through that gateway's admin API.

The lead's ``triton`` fixture (tests/conftest.py, the real image models) is used only by the tests
that need those models.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from _tiny_repo import build_tiny_repository

from serving.launcher import TritonPorts, TritonServer, free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "test-admin-token-5f1c9e0b7a"
#: tiers the tests use: "tiny" makes the shared-limit test independent of how long it takes
#: (one token a minute), "unlimited" keeps the other tests clear of rate limiting.
TEST_TIERS = {
    "free": {"per_minute": 10, "burst": 5},
    "tiny": {"per_minute": 1, "burst": 4},
    "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
}
_START_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def tiny_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """Real Triton serving ``tiny_linear`` and ``slow_echo``."""
    repository = build_tiny_repository(tmp_path_factory.mktemp("tiny-repository"))
    server = TritonServer(repository, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server (Debian's binary; ``./run test`` installs it when missing)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not installed: run `./run test` (it installs it) or `apt-get install redis-server`"
        )
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url, socket_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield url
    process.terminate()
    process.wait(timeout=10)


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


@pytest.fixture(scope="session")
def gateway_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """``factory(triton_http_url, workdir=None, **settings) -> GatewayProcess``; all stopped at the end."""
    started: list[GatewayProcess] = []

    def factory(triton_http_url: str, workdir: Path | None = None, **settings: object) -> GatewayProcess:
        gateway = start_gateway(workdir or tmp_path_factory.mktemp("gateway"), triton_http_url, **settings)
        started.append(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="session")
def gateway(gateway_factory, tiny_triton: TritonServer) -> GatewayProcess:  # type: ignore[no-untyped-def]
    """The shared gateway in front of the tiny Triton (in-process rate limits)."""
    return gateway_factory(tiny_triton.http_url, max_body_bytes=64 * 1024)


@dataclass
class Admin:
    """Creates keys through a gateway's admin API."""

    gateway: GatewayProcess

    def create_key(
        self, scopes: list[str] | None = None, tier: str = "unlimited", name: str = "test"
    ) -> dict[str, object]:
        response = httpx.post(
            f"{self.gateway.url}/admin/keys",
            json={"name": name, "scopes": scopes or ["*"], "tier": tier},
            headers={"X-Admin-Token": ADMIN_TOKEN},
            timeout=10,
        )
        assert response.status_code == 201, response.text
        return response.json()  # type: ignore[no-any-return]

    def headers(self, key: dict[str, object]) -> dict[str, str]:
        return {"Authorization": f"Bearer {key['api_key']}"}


@pytest.fixture(scope="session")
def admin(gateway: GatewayProcess) -> Admin:
    return Admin(gateway)


def tiny_request(rows: int = 1) -> dict[str, object]:
    """A KServe v2 JSON body for ``tiny_linear``."""
    return {
        "inputs": [
            {"name": "input", "shape": [rows, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0] * rows}
        ]
    }
