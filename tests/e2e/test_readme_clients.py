"""The README's client snippets (OpenAI SDK, tritonclient HTTP and gRPC, curl) run as written against a
real gateway in front of the real Triton serving the test models."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.launcher import TritonServer
from serving.ports import reserve_port
from tests.support.gateway_procs import GatewayProcess, create_key, start_gateway
from tests.support.repository import ROOT

pytestmark = pytest.mark.integration


def _snippets() -> list[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Clients\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(python|bash)\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture(scope="module")
def readme_gateway(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("readme-gateway"), triton.http_url, grpc_port=reserve_port()
    )
    yield gateway
    gateway.stop()


def test_the_readme_shows_one_snippet_per_client() -> None:
    kinds = [
        (
            language,
            "openai" in code,
            "tritonclient.http" in code,
            "tritonclient.grpc" in code,
            "curl" in code,
        )
        for language, code in _snippets()
    ]
    assert kinds == [
        ("python", True, False, False, False),
        ("python", False, True, False, False),
        ("python", False, False, True, False),
        ("bash", False, False, False, True),
    ]


@pytest.mark.parametrize(
    "index", range(4), ids=["openai", "tritonclient-http", "tritonclient-grpc", "curl"]
)
def test_readme_snippet_runs(readme_gateway: GatewayProcess, tmp_path: Path, index: int) -> None:
    language, code = _snippets()[index]
    headers, _ = create_key(readme_gateway)
    env = dict(
        os.environ,
        GATEWAY=readme_gateway.url.removeprefix("http://"),
        GATEWAY_GRPC=readme_gateway.grpc_url,
        API_KEY=headers["Authorization"].removeprefix("Bearer "),
    )
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-c", code]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    expected = {
        0: r"^384 \d+$",
        1: r"^\(1, 1000\)$",
        2: r"^\(1, 1000\)$",
        3: r'"embedding":\s*\[-?\d.*"usage"',
    }[index]
    assert re.search(expected, done.stdout.strip()), done.stdout[:300]
