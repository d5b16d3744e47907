"""Fixtures for the fault tests: real Triton, real gateway subprocesses, real redis-server.

Everything binds 127.0.0.1 on free ports and is stopped at the end of its scope. The processes are
started with the same helpers as the gateway's own tests (``tests/support/gateway_procs.py``) and the same
tiny repository (``tests/support/tiny_repo.py``: ``tiny_linear`` answers in about a millisecond,
``slow_echo`` sleeps ``DELAY_MS`` first).

- ``rel_triton``: a Triton of our own serving the tiny repository (module scope, so a test that
  kills it or leaves ``slow_echo`` sleeping cannot disturb the next module).
- ``gateways``: ``factory(triton_http_url, **settings) -> GatewayProcess``; all stopped at the end.
- ``make_key``: ``make_key(gateway, tier="unlimited", scopes=None) -> (headers, created)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serving.launcher import TritonPorts, TritonServer
from tests.support.gateway_procs import GatewayProcess, create_key, start_gateway
from tests.support.tiny_repo import build_tiny_repository

#: tiers the fault tests use, on top of the shared test tiers
RELIABILITY_TIERS = {
    "free": {"per_minute": 10, "burst": 5},
    "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
    # 10/s sustained: a closed loop of a few workers is mostly refused, so "limits hold" is visible
    "limited": {"per_minute": 600, "burst": 5},
}

GatewayFactory = Callable[..., GatewayProcess]


@pytest.fixture(scope="module")
def rel_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_repository(tmp_path_factory.mktemp("rel-repository"))


@pytest.fixture(scope="module")
def rel_triton(rel_repository: Path) -> Iterator[TritonServer]:
    """A Triton of this module's own (tiny_linear + slow_echo)."""
    server = TritonServer(rel_repository, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFactory]:
    started: list[GatewayProcess] = []

    def factory(triton_http_url: str, **settings: object) -> GatewayProcess:
        settings.setdefault("tier_limits", RELIABILITY_TIERS)
        gateway = start_gateway(tmp_path_factory.mktemp("rel-gateway"), triton_http_url, **settings)
        started.append(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()


@pytest.fixture
def make_key() -> Callable[..., tuple[dict[str, str], dict[str, object]]]:
    return create_key
