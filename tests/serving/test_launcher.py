"""The embedded launcher's failure modes, against the real Triton binary."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from serving.launcher import TritonPorts, TritonServer, TritonStartError, assemble_backends


def test_backend_directory_has_python_and_our_backends(tmp_path: Path) -> None:
    target = assemble_backends(tmp_path)
    assert (target / "python" / "libtriton_python.so").exists()
    assert (target / "python" / "triton_python_backend_stub").exists()
    assert (target / "onnxruntime" / "model.py").exists()
    # model.py imports the shared core (and the core its grouping) by bare name: a copy of each beside it
    for backend in ("onnxruntime", "pytorch"):
        for shared in ("batching_core.py", "ragged_groups.py", "step_metrics.py"):
            assert (target / backend / shared).exists()


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
    server = TritonServer(
        tmp_path / "repo", models=["efficientnet_lite0"], ports=TritonPorts.free()
    )
    with pytest.raises(TritonStartError, match="efficientnet_lite0"):
        server.start()
    assert not server.running()


_PROBE = """
import json, ssl, sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        facts = json.dumps(
            {"version": sys.version.split()[0], "numpy": np.__file__, "ssl": ssl.OPENSSL_VERSION}
        )
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("FACTS", np.array([facts.encode()], dtype=object))]
            )
            for _ in requests
        ]
"""


@pytest.mark.integration
def test_python_models_run_on_this_interpreter_and_environment(tmp_path: Path, monkeypatch) -> None:
    """The stub must embed this Python (not the system's) and see this environment's packages,
    even when the environment is not activated (as under CI)."""
    import json
    import platform

    import numpy as np
    import tritonclient.http as http

    from builders.spec import BatchingPolicy, TensorSpec
    from builders.triton_config import ConfigOptions, model_config, write_config

    entry = tmp_path / "repo" / "probe"
    (entry / "1").mkdir(parents=True)
    (entry / "1" / "model.py").write_text(_PROBE)
    write_config(
        model_config(
            "probe",
            inputs=[TensorSpec("X", "float32", (1,))],
            outputs=[TensorSpec("FACTS", "bytes", (1,))],
            batching=BatchingPolicy(0),
            options=ConfigOptions(backend="python", warmup=False),
        ),
        entry / "config.pbtxt",
    )
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv(
        "PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    )
    with TritonServer(tmp_path / "repo", models=["probe"], ports=TritonPorts.free()) as server:
        tensor = http.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        with http.InferenceServerClient(server.http_url) as client:
            facts = json.loads(client.infer("probe", [tensor]).as_numpy("FACTS")[0])
    assert facts["version"] == platform.python_version()
    assert facts["numpy"] == np.__file__


def test_the_cuda_memory_pool_is_triton_s_own_unless_asked(tmp_path: Path) -> None:
    def pool_flags(server: TritonServer) -> list[str]:
        return [a for a in server.command(tmp_path) if a.startswith("--cuda-memory-pool")]

    assert pool_flags(TritonServer(tmp_path, models=[])) == []
    sized = TritonServer(tmp_path, models=[], cuda_memory_pool_mb=512)
    assert pool_flags(sized) == ["--cuda-memory-pool-byte-size=0:536870912"]
