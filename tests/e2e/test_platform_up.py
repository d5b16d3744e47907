"""The README's first command, ``inferctl up``, end to end; and the supervisor's crash recovery."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from skimage import data

from serving.launcher import TritonPorts, TritonServer
from serving.ports import reserve_port
from serving.processes import ManagedProcess
from serving.supervisor import TritonSupervisor

pytestmark = pytest.mark.integration


def test_up_serves_a_first_request_through_the_gateway(
    model_repository: Path, tmp_path: Path
) -> None:
    ports = TritonPorts.free()
    gateway_port, gateway_grpc_port = reserve_port(), reserve_port()
    command = [
        sys.executable,
        "-m",
        "inferctl",
        "up",
        "--repository",
        str(model_repository),
        "--models",
        "image_classifier",
        "--state-dir",
        str(tmp_path / "state"),
        "--triton-http-port",
        str(ports.http),
        "--triton-grpc-port",
        str(ports.grpc),
        "--triton-metrics-port",
        str(ports.metrics),
        "--gateway-port",
        str(gateway_port),
        "--gateway-grpc-port",
        str(gateway_grpc_port),
    ]
    env = dict(os.environ, COLUMNS="200", GATEWAY_ADMIN_TOKEN="")
    process = ManagedProcess(command, name="inferctl up", env=env).start()
    try:
        process.wait_until(
            lambda: "Press Ctrl-C" in process.log_tail(), timeout_s=240, what="printing its welcome"
        )
        output = "\n".join(process.log_lines())
        key = re.search(r"(gk_[A-Za-z0-9_\-]+)", output)
        assert key, output
        assert f"http://127.0.0.1:{gateway_port}/v1/classify" in output
        assert f"KServe v2 gRPC 127.0.0.1:{gateway_grpc_port}" in output
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
        import tritonclient.grpc as grpcclient

        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway_grpc_port}")
        try:  # the gateway's gRPC entry, with the same key
            assert grpc.is_model_ready(
                "image_classifier", headers={"authorization": f"Bearer {key.group(1)}"}
            )
        finally:
            grpc.close()
        assert not (tmp_path / "state" / "keys.sqlite3").read_bytes().count(key.group(1).encode())
    finally:
        process.stop(
            timeout_s=60
        )  # SIGTERM: `inferctl up` stops the gateway and Triton, then exits 0
    assert process.returncode == 0, process.log_tail()


def test_supervisor_restarts_a_crashed_triton(model_repository: Path) -> None:
    server = TritonServer(model_repository, models=["efficientnet_lite0"], ports=TritonPorts.free())
    with TritonSupervisor(server.start()):
        first_pid = server.pid
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if (
                    server.pid != first_pid
                    and httpx.get(
                        f"http://{server.http_url}/v2/models/efficientnet_lite0/ready", timeout=1
                    ).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("Triton was not restarted and ready within 60 s")
    assert not server.running()
