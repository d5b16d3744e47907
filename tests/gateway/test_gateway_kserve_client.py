"""KServe's Python client (PyPI ``kserve``) through the real gateway, in front of the real Triton.

``kserve`` cannot be installed beside the project's pins (``tests/fixtures/kserve_client/record.py``
says why), so these tests replay the exact requests its ``InferenceRESTClient`` (JSON and binary
extension) and ``InferenceGRPCClient`` sent, recorded from kserve 0.21.0 making those calls for real
through a gateway: the REST body names ``model_name``, and gRPC inputs carry ``binary_data_size``.
Each replay must get Triton's own answer to the same rows, in the shape kserve's
``InferResponse.from_bytes`` / ``from_grpc`` read.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from serving.ports import reserve_port
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "kserve_client" / "requests.json").read_text())
MODEL = RECORDED["model"]
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) / 7  # what record.py sent


@pytest.fixture(scope="module")
def kserve_gateway(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(tiny_triton.http_url, grpc_port=reserve_port(), max_body_bytes=64 * 1024)


@pytest.fixture(scope="module")
def auth(kserve_gateway) -> str:  # type: ignore[no-untyped-def]
    return f"Bearer {create_key(kserve_gateway, scopes=[MODEL])[1]['api_key']}"


@pytest.fixture(scope="module")
def expected(tiny_triton) -> np.ndarray:  # type: ignore[no-untyped-def]
    tensor = http.InferInput("input", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS)
    with http.InferenceServerClient(tiny_triton.http_url) as direct:
        return direct.infer(MODEL, [tensor]).as_numpy("output")  # type: ignore[no-any-return]


def _grpc_request() -> pb.ModelInferRequest:
    return pb.ModelInferRequest.FromString(base64.b64decode(RECORDED["grpc_model_infer_request_b64"]))


def test_the_recording_is_of_the_calls_this_test_is_about() -> None:
    bodies = [base64.b64decode(r["body_b64"]) for r in RECORDED["rest"]]
    assert [r["path"] for r in RECORDED["rest"]] == [f"/v2/models/{MODEL}/infer"] * 2
    assert all(b'"model_name":"tiny_linear"' in body for body in bodies)
    assert "inference-header-content-length" in RECORDED["rest"][1]["headers"]
    assert _grpc_request().inputs[0].parameters["binary_data_size"].int64_param == ROWS.nbytes
    answers = list(RECORDED["answers"].values())  # the three live calls answered the same rows alike
    assert len(answers) == 3 and all(np.array(a).shape == (3, 2) and a == answers[0] for a in answers)


@pytest.mark.parametrize("call", [0, 1], ids=["json", "binary"])
def test_rest_client_requests_get_triton_s_answer(kserve_gateway, auth, expected, call: int) -> None:  # type: ignore[no-untyped-def]
    sent = RECORDED["rest"][call]
    response = httpx.post(kserve_gateway.url + sent["path"], content=base64.b64decode(sent["body_b64"]),
                          headers={**sent["headers"], "Authorization": auth})
    assert response.status_code == 200, response.text
    # What kserve's InferResponse.from_bytes reads: JSON up to Inference-Header-Content-Length (all of it here).
    length = int(response.headers.get("inference-header-content-length", len(response.content)))
    document = json.loads(response.content[:length])
    assert document["model_name"] == MODEL and document["id"] == "kserve-1"
    (output,) = document["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("output", "FP32", list(expected.shape))
    got = np.array(output["data"], dtype=np.float32).reshape(expected.shape)
    assert got.tobytes() == expected.tobytes()
    np.testing.assert_allclose(got, np.array(RECORDED["answers"][f"rest_binary_{'true' if call else 'false'}"]))


def test_a_body_naming_another_model_than_its_path_is_refused(kserve_gateway, auth) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(base64.b64decode(RECORDED["rest"][0]["body_b64"]))
    response = httpx.post(kserve_gateway.url + f"/v2/models/{MODEL}/infer", json={**body, "model_name": "slow_echo"},
                          headers={"Authorization": auth, "Accept": "application/problem+json"})
    assert response.status_code == 400 and response.json()["field"] == "model_name", response.text
    assert "slow_echo" in response.json()["detail"]


def test_grpc_client_request_gets_triton_s_answer(kserve_gateway, auth, expected) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(kserve_gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(_grpc_request(), metadata=(("authorization", auth),), timeout=30)
        # What kserve's InferResponse.from_grpc reads: raw_output_contents, one per output.
        (output,) = response.outputs
        assert (response.model_name, output.name, list(output.shape)) == (MODEL, "output", list(expected.shape))
        got = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(expected.shape)
        assert got.tobytes() == expected.tobytes()
        np.testing.assert_allclose(got, np.array(RECORDED["answers"]["grpc"]))

        wrong = _grpc_request()
        wrong.inputs[0].parameters["binary_data_size"].int64_param = ROWS.nbytes - 4
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(wrong, metadata=(("authorization", auth),), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "binary_data_size" in (refused.value.details() or "")
