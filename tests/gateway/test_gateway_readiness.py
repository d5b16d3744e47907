"""Honest readiness against the real gateway and a real Triton of its own (models are unloaded here).

``/readyz`` is 200 only when every model of ``GATEWAY_READY_MODELS`` is READY and answers a synthetic
inference; the Triton pod's probe (``serving/readiness.py`` run as a script, as the Triton image
runs it) asks the same. A model unloaded, or loaded but failing every request, is named in the 503.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import triton_to_np_dtype

from serving import readiness
from serving.launcher import TritonPorts, TritonServer
from tests.support.tiny_repo import SLOW_MODEL, TINY_MODEL, build_tiny_repository

pytestmark = pytest.mark.integration

BROKEN_MODEL = "broken_model"
_BROKEN_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("weights missing in this image"))
                for _ in requests]
"""
SCRIPT = Path(readiness.__file__)


@pytest.fixture(scope="module")
def own_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """Triton with the tiny models and one that loads READY but fails every inference."""
    root = build_tiny_repository(tmp_path_factory.mktemp("readiness-repository"))
    (root / BROKEN_MODEL / "1").mkdir(parents=True)
    (root / BROKEN_MODEL / "1" / "model.py").write_text(_BROKEN_PY)
    config = mc.ModelConfig(name=BROKEN_MODEL, backend="python", max_batch_size=0)
    config.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[2])
    config.output.add(name="OUT", data_type=mc.TYPE_FP32, dims=[2])
    (root / BROKEN_MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    server = TritonServer(root, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


def _probe(server: TritonServer, models: str) -> subprocess.CompletedProcess[str]:
    """The Triton pod's readiness probe, run as the image runs it: a script, models from READY_MODELS."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--url", f"http://{server.http_url}"],
        env={"READY_MODELS": models},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_readyz_names_an_unloaded_model_and_recovers(
    gateway_factory, own_triton: TritonServer
) -> None:  # type: ignore[no-untyped-def]
    gateway = gateway_factory(
        own_triton.http_url, ready_models=[TINY_MODEL, SLOW_MODEL], ready_cache_s=0
    )
    ready = httpx.get(gateway.url + "/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    assert ready.json()["models"] == [TINY_MODEL, SLOW_MODEL]
    assert _probe(own_triton, f"{TINY_MODEL},{SLOW_MODEL}").returncode == 0

    with triton_http.InferenceServerClient(own_triton.http_url) as client:
        client.unload_model(TINY_MODEL)
        try:
            down = httpx.get(gateway.url + "/readyz", timeout=30)
            assert down.status_code == 503 and "Retry-After" in down.headers
            assert f"{TINY_MODEL} (not READY in Triton)" in down.json()["detail"]
            assert SLOW_MODEL not in down.json()["detail"]
            probe = _probe(own_triton, f"{TINY_MODEL},{SLOW_MODEL}")
            assert probe.returncode == 1 and f"{TINY_MODEL}: not READY" in probe.stderr
            assert SLOW_MODEL not in probe.stderr
        finally:
            client.load_model(TINY_MODEL)
    assert httpx.get(gateway.url + "/readyz", timeout=30).status_code == 200


def test_readyz_names_a_ready_model_whose_inference_fails(
    gateway_factory, own_triton: TritonServer
) -> None:  # type: ignore[no-untyped-def]
    with triton_http.InferenceServerClient(own_triton.http_url) as client:
        assert client.is_model_ready(BROKEN_MODEL)
    gateway = gateway_factory(own_triton.http_url, ready_models=[TINY_MODEL, BROKEN_MODEL])
    down = httpx.get(gateway.url + "/readyz", timeout=30)
    assert down.status_code == 503
    detail = down.json()["detail"]
    assert f"{BROKEN_MODEL} (synthetic inference failed" in detail and TINY_MODEL not in detail
    probe = _probe(own_triton, f"{TINY_MODEL},{BROKEN_MODEL}")
    assert probe.returncode == 1 and "weights missing in this image" in probe.stderr
    assert TINY_MODEL not in probe.stderr


def test_readyz_without_models_follows_triton(  # type: ignore[no-untyped-def]
    gateway_factory, own_triton: TritonServer
) -> None:
    gateway = gateway_factory(own_triton.http_url)
    ready = httpx.get(gateway.url + "/readyz", timeout=30)
    assert ready.status_code == 200 and ready.json()["models"] == []


def test_probe_script_without_models_is_a_usage_error(own_triton: TritonServer) -> None:
    assert _probe(own_triton, "").returncode == 2


# --- the synthetic request itself (units) -------------------------------------------------------


def test_element_sizes_agree_with_tritonclient() -> None:
    for datatype, size in readiness.ELEMENT_BYTES.items():
        if datatype == "BF16":
            continue  # tritonclient has no numpy dtype for BF16; two bytes on the wire
        assert np.dtype(triton_to_np_dtype(datatype)).itemsize == size, datatype


def test_probe_png_is_a_real_image() -> None:
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(readiness.probe_png()))
    image.load()
    assert image.size == (8, 8) and image.mode == "RGB"


def test_probe_inputs_follow_the_config_and_the_task() -> None:
    config = {
        "max_batch_size": 8,
        "parameters": {"task": {"string_value": "classification"}},
        "input": [
            {"name": "IMAGE", "data_type": "TYPE_STRING", "dims": ["1"]},
            {"name": "SIZE", "data_type": "TYPE_INT32", "dims": ["-1", "2"]},
            {"name": "EXTRA", "data_type": "TYPE_FP32", "dims": ["3"], "optional": True},
        ],
    }
    image, size = readiness.probe_inputs(config)
    assert (image.datatype, image.shape, image.value) == ("BYTES", (1, 1), readiness.probe_png())
    assert (size.datatype, size.shape, size.value) == ("INT32", (1, 1, 2), None)
    text = readiness.probe_inputs(
        {"input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"]}]}
    )
    assert text[0].shape == (1,) and text[0].value == readiness.PROBE_TEXT
    with pytest.raises(ValueError, match="no probe can fill"):
        readiness.probe_inputs(
            {"input": [{"name": "X", "data_type": "TYPE_CUSTOM", "dims": ["1"]}]}
        )


def test_model_lists_parse_from_either_form() -> None:
    assert readiness.parse_model_list(" a, b ,a ") == ["a", "b"]
    assert readiness.parse_model_list('["a", "b"]') == ["a", "b"]
    assert readiness.parse_model_list("") == []


def test_probe_script_runs_on_python_3_10_syntax() -> None:
    """The Triton image runs it with its own Python (3.10 in 24.10-py3)."""
    import ast

    ast.parse(SCRIPT.read_text(), feature_version=(3, 10))


class _CountingBackend:
    """Answers readiness and inference, counting the inferences (unit test of the cache only)."""

    def __init__(self) -> None:
        self.inferences = 0

    async def server_ready(self, *, timeout_s: float) -> bool:
        return True

    async def model_ready(self, model: str, *, timeout_s: float, version: str = "") -> bool:
        return True

    async def model_config(self, model: str, *, timeout_s: float, version: str = "") -> dict:
        return {
            "max_batch_size": 4,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["2"]}],
        }

    async def infer(  # type: ignore[no-untyped-def]
        self, model, inputs, outputs=None, *, timeout_s, version="", priority=0
    ):
        self.inferences += 1
        assert inputs[0].data.shape == (1, 2)
        return {}


async def test_model_checks_are_cached_for_the_configured_time() -> None:
    from gateway.backends.readiness import ReadinessProbe

    now = [100.0]
    backend = _CountingBackend()
    probe = ReadinessProbe(
        backend,  # type: ignore[arg-type]
        ["a", "b"],
        cache_s=5.0,
        timeout_s=1.0,
        clock=lambda: now[0],
    )
    assert (await probe.check()).ready and backend.inferences == 2
    now[0] += 4.9
    assert (await probe.check()).ready and backend.inferences == 2
    now[0] += 0.2
    assert (await probe.check()).ready and backend.inferences == 4
