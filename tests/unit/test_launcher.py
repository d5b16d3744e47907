"""The embedded launcher's failure modes, against the real Triton binary."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from serving.launcher import TritonPorts, TritonServer, TritonStartError, assemble_backends


def test_backend_directory_has_python_and_our_backends(tmp_path: Path) -> None:
    target = assemble_backends(tmp_path)
    assert (target / "python" / "libtriton_python.so").exists()
    assert (target / "python" / "triton_python_backend_stub").exists()
    assert (target / "onnxruntime" / "model.py").exists()


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    ports = TritonPorts.free()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.http))
        holder.listen()
        with pytest.raises(TritonStartError, match=rf"port {ports.http} \(HTTP\).*already in use"):
            TritonServer(tmp_path, models=[], ports=ports).start()


def test_a_model_missing_from_the_repository_is_named(tmp_path: Path) -> None:
    with pytest.raises(TritonStartError, match="not in the model repository.*ghost"):
        TritonServer(tmp_path, models=["ghost"], ports=TritonPorts.free()).start()


@pytest.mark.integration
def test_a_model_that_fails_to_load_is_reported(model_repository: Path, tmp_path: Path) -> None:
    broken = tmp_path / "repo" / "efficientnet_lite0"
    shutil.copytree(model_repository / "efficientnet_lite0", broken)
    for version in broken.iterdir():
        if version.is_dir():
            (version / "model.onnx").write_bytes(b"this is not an onnx file")
    server = TritonServer(tmp_path / "repo", models=["efficientnet_lite0"], ports=TritonPorts.free())
    with pytest.raises(TritonStartError, match="efficientnet_lite0"):
        server.start()
    assert not server.running()
