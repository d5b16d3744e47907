"""KServe's Python client (PyPI ``kserve``) through the real gateway, in front of the real Triton.

``kserve`` cannot be installed beside the project's pins (kserve 0.21.0 requires ``psutil<6`` and
``python-dateutil<3``), so ``./run test`` installs it into an environment of its own,
``.tools/kserve``, from ``tests/fixtures/kserve_client/requirements.txt``. The test runs
``tests/fixtures/kserve_client/client.py`` with that environment's interpreter: the real
``InferenceRESTClient`` (JSON, and the binary-data extension) and ``InferenceGRPCClient`` call the
gateway with an API key, and every answer they decode must be Triton's own answer to the same rows.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from serving.ports import reserve_port
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLIENT_DIR = REPO / "tests" / "fixtures" / "kserve_client"
KSERVE_PYTHON = REPO / ".tools" / "kserve" / "bin" / "python"
MODEL = "tiny_linear"
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def _pinned_kserve() -> str:
    for line in (CLIENT_DIR / "requirements.txt").read_text().splitlines():
        if line.startswith("kserve=="):
            return line.split("==", 1)[1]
    raise AssertionError("requirements.txt pins no kserve")


@pytest.fixture(scope="module")
def kserve_python() -> Path:
    if os.access(KSERVE_PYTHON, os.X_OK):
        return KSERVE_PYTHON
    missing = (
        "the KServe client is not installed: `./run test` installs it into .tools/kserve "
        f"(or: python3 -m venv .tools/kserve && .tools/kserve/bin/pip install --no-deps -r "
        f"{CLIENT_DIR.relative_to(REPO)}/requirements.txt)"
    )
    if os.environ.get(
        "CI"
    ):  # ./run test installs it first: in CI its absence is a defect, not a skip
        pytest.fail(missing)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def kserve_gateway(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(tiny_triton.http_url, grpc_port=reserve_port(), max_body_bytes=64 * 1024)


@pytest.fixture(scope="module")
def api_key(kserve_gateway) -> str:  # type: ignore[no-untyped-def]
    return str(create_key(kserve_gateway, scopes=[MODEL])[1]["api_key"])


@pytest.fixture(scope="module")
def expected(tiny_triton) -> np.ndarray:  # type: ignore[no-untyped-def]
    tensor = http.InferInput("input", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS)
    with http.InferenceServerClient(tiny_triton.http_url) as direct:
        return direct.infer(MODEL, [tensor]).as_numpy("output")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def kserve_answers(  # type: ignore[no-untyped-def]
    kserve_python: Path, kserve_gateway, api_key: str
) -> dict[str, Any]:
    # The client's own environment only: nothing of the project's interpreter or source tree leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run(
        [
            str(kserve_python),
            str(CLIENT_DIR / "client.py"),
            kserve_gateway.url,
            kserve_gateway.grpc_url,
            api_key,
            MODEL,
            json.dumps(ROWS.tolist()),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_the_pinned_client_is_the_one_that_ran(kserve_answers) -> None:  # type: ignore[no-untyped-def]
    assert kserve_answers["kserve"] == _pinned_kserve()


@pytest.mark.parametrize("call", ["rest_json", "rest_binary", "grpc"])
def test_the_client_decodes_triton_s_answer(  # type: ignore[no-untyped-def]
    kserve_answers, expected, call: str
) -> None:
    answer = kserve_answers[call]
    assert (answer["id"], answer["model_name"]) == ("kserve-1", MODEL)
    assert (answer["name"], answer["datatype"], answer["dtype"]) == ("output", "FP32", "float32")
    assert answer["shape"] == list(expected.shape)
    # float32 -> JSON -> float32 is exact: the bytes must be Triton's own.
    assert np.array(answer["data"], dtype=np.float32).tobytes() == expected.tobytes()


def test_the_client_without_a_key_is_refused_on_both_transports(  # type: ignore[no-untyped-def]
    kserve_answers,
) -> None:
    rest = kserve_answers["rest_without_key"]
    # KServe's error shape, {"error": message}, which kserve reads into its exception only when the
    # content type is exactly application/json: the user sees the gateway's reason.
    assert (rest["status"], rest["content_type"], list(rest["body"])) == (
        401,
        "application/json",
        ["error"],
    ), rest
    assert rest["body"]["error"] and rest["message"].startswith(
        rest["body"]["error"] + ", '401 Unauthorized'"
    ), rest
    assert kserve_answers["grpc_without_key"]["code"] == "UNAUTHENTICATED", kserve_answers[
        "grpc_without_key"
    ]


def test_a_kserve_shaped_grpc_request_with_a_wrong_binary_size_is_refused(
    kserve_gateway, api_key
) -> None:  # type: ignore[no-untyped-def]
    # InferenceGRPCClient sends each input's bytes in raw_input_contents and names their length in the
    # input's binary_data_size parameter; a length that disagrees with the bytes must be refused.
    request = pb.ModelInferRequest(
        model_name=MODEL,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="input",
                datatype="FP32",
                shape=list(ROWS.shape),
                parameters={"binary_data_size": pb.InferParameter(int64_param=ROWS.nbytes - 4)},
            )
        ],
        raw_input_contents=[ROWS.tobytes()],
    )
    with grpc.insecure_channel(kserve_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=(("authorization", f"Bearer {api_key}"),), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "binary_data_size" in (refused.value.details() or "")
