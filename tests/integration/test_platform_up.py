"""The README's first command, ``inferctl up``, end to end; and the supervisor's crash recovery."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from skimage import data

from serving.launcher import TritonPorts, TritonServer, free_port
from serving.supervisor import TritonSupervisor

pytestmark = pytest.mark.integration


def _wait_for_line(process: subprocess.Popen[str], pattern: str, timeout_s: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"'{pattern}' never printed; output:\n{''.join(lines)}")


def test_up_serves_a_first_request_through_the_gateway(model_repository: Path, tmp_path: Path) -> None:
    ports = TritonPorts.free()
    gateway_port = free_port()
    command = [
        sys.executable, "-m", "inferctl", "up", "--repository", str(model_repository),
        "--models", "image_classifier", "--state-dir", str(tmp_path / "state"),
        "--triton-http-port", str(ports.http), "--triton-grpc-port", str(ports.grpc),
        "--triton-metrics-port", str(ports.metrics), "--gateway-port", str(gateway_port),
    ]
    env = dict(os.environ, COLUMNS="200", GATEWAY_ADMIN_TOKEN="")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        lines = _wait_for_line(process, r"Press Ctrl-C", timeout_s=240)
        output = "".join(lines)
        key = re.search(r"(gk_[A-Za-z0-9_\-]+)", output)
        assert key, output
        assert f"http://127.0.0.1:{gateway_port}/v1/classify" in output
        photo = io.BytesIO()
        Image.fromarray(data.chelsea()).save(photo, format="JPEG")
        response = httpx.post(
            f"http://127.0.0.1:{gateway_port}/v1/classify",
            headers={"Authorization": f"Bearer {key.group(1)}"},
            files={"file": ("photo.jpg", photo.getvalue(), "image/jpeg")},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert 281 <= response.json()["results"][0]["top"][0]["class_id"] <= 285
        assert not (tmp_path / "state" / "keys.sqlite3").read_bytes().count(key.group(1).encode())
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


def test_supervisor_restarts_a_crashed_triton(model_repository: Path) -> None:
    server = TritonServer(model_repository, models=["efficientnet_lite0"], ports=TritonPorts.free())
    with TritonSupervisor(server.start()):
        first_pid = server.pid
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if server.pid != first_pid and httpx.get(
                    f"http://{server.http_url}/v2/models/efficientnet_lite0/ready", timeout=1
                ).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("Triton was not restarted and ready within 60 s")
    assert not server.running()
