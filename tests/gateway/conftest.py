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

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from serving.launcher import TritonPorts, TritonServer
from tests.support.gateway_procs import (
    GatewayProcess,
    create_key,
    start_gateway,
    start_redis,
)
from tests.support.tiny_repo import build_tiny_repository


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
    try:
        server = start_redis(tmp_path_factory.mktemp("redis"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def gateway_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """``factory(triton_http_url, workdir=None, **settings) -> GatewayProcess``; all stopped at the end."""
    started: list[GatewayProcess] = []

    def factory(
        triton_http_url: str, workdir: Path | None = None, **settings: object
    ) -> GatewayProcess:
        gateway = start_gateway(
            workdir or tmp_path_factory.mktemp("gateway"), triton_http_url, **settings
        )
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
        _, created = create_key(self.gateway, tier=tier, scopes=scopes, name=name)
        return created

    def headers(self, key: dict[str, object]) -> dict[str, str]:
        return {"Authorization": f"Bearer {key['api_key']}"}


@pytest.fixture(scope="session")
def admin(gateway: GatewayProcess) -> Admin:
    return Admin(gateway)
