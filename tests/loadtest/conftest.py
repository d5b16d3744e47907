"""Fixtures for the load-test smoke tests: the real gateway in front of the session's real Triton."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.bench import gateway_available, gateway_server
from serving.launcher import TritonServer


@pytest.fixture(scope="module")
def gateway(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The gateway as a subprocess, with a high-limit key and a free-tier key.

    Yields ``{"url", "key", "free_key"}``.
    """
    if not gateway_available():
        pytest.skip("the gateway package is not importable here yet")
    from gateway.keys import KeyStore

    workdir = tmp_path_factory.mktemp("gateway")
    with gateway_server(triton.http_url, workdir) as (url, key):
        _, free_key = KeyStore(Path(workdir) / "gateway_keys.sqlite3").create("loadtest-free", ["*"], "free")
        yield {"url": url, "key": key, "free_key": free_key}
