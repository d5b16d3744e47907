"""The gateway -> Triton gRPC transport (``GATEWAY_TRITON_PROTOCOL=grpc``) against the real Triton:
clients see the same answers, errors and encodings as through the HTTP transport or straight from
Triton."""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from gateway.backends.triton import Tensor, TritonHttpBackend
from gateway.backends.triton_grpc import TritonGrpcBackend
from serving.ports import reserve_port
from tests.support.api_errors import api_error
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

MODEL = "tiny_linear"
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
INFER = f"/v2/models/{MODEL}/infer"


@pytest.fixture(scope="module")
def grpc_gateway(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    gateway = gateway_factory(
        tiny_triton.http_url,
        triton_protocol="grpc",
        triton_grpc_url=tiny_triton.grpc_url,
        upstream_timeout_s=2,
    )
    return gateway, create_key(gateway)[0]


def _request(
    binary_output: bool | None = None,
    class_count: int = 0,
    request_id: str = "",
) -> list:  # type: ignore[type-arg]
    tensor = http.InferInput("input", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS, binary_data=True)
    output = http.InferRequestedOutput(
        "output", binary_data=bool(binary_output), class_count=class_count
    )
    return [[tensor], [output] if binary_output is not None or class_count else None, request_id]


@pytest.mark.parametrize(
    ("binary_output", "class_count", "request_id"),
    [(None, 0, ""), (True, 0, "req-7"), (False, 0, ""), (False, 1, ""), (True, 2, "")],
    ids=["default", "binary", "json", "classification", "classification-binary"],
)
def test_inference_answers_as_triton_does(
    grpc_gateway, tiny_triton, binary_output, class_count, request_id
) -> None:  # type: ignore[no-untyped-def]
    gateway, auth = grpc_gateway
    through = http.InferenceServerClient(gateway.url.removeprefix("http://"))
    direct = http.InferenceServerClient(tiny_triton.http_url)
    try:
        inputs, outputs, rid = _request(binary_output, class_count, request_id)
        got = through.infer(
            MODEL, inputs, outputs=outputs, request_id=rid, headers=dict(auth)
        )  # it writes into it
        want = direct.infer(MODEL, inputs, outputs=outputs, request_id=rid)
        assert got.get_response() == want.get_response()  # header: names, shapes, ids, binary sizes
        assert got.as_numpy("output").tolist() == want.as_numpy("output").tolist()  # BYTES too
    finally:
        through.close()
        direct.close()


def test_json_bodies_and_compressed_answers(  # type: ignore[no-untyped-def]
    grpc_gateway, tiny_triton
) -> None:
    gateway, auth = grpc_gateway
    body = {
        "inputs": [
            {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
        ]
    }
    want = httpx.post(f"http://{tiny_triton.http_url}{INFER}", json=body).json()
    plain = httpx.post(gateway.url + INFER, json=body, headers=auth)
    assert plain.status_code == 200 and plain.json() == want
    raw = httpx.post(gateway.url + INFER, json=body, headers={**auth, "Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip"
    assert (
        json.loads(gzip.decompress(raw.content) if raw.content[:2] == b"\x1f\x8b" else raw.content)
        == want
    )


def test_model_calls_answer_as_over_http(grpc_gateway, tiny_triton) -> None:  # type: ignore[no-untyped-def]
    gateway, auth = grpc_gateway
    through = http.InferenceServerClient(gateway.url.removeprefix("http://"))
    direct = http.InferenceServerClient(tiny_triton.http_url)
    try:
        assert through.is_server_ready(headers=auth) and through.is_model_ready(MODEL, headers=auth)
        for version in ("", "1"):
            assert through.get_model_metadata(
                MODEL, version, headers=auth
            ) == direct.get_model_metadata(MODEL, version)
            assert through.get_model_config(
                MODEL, version, headers=auth
            ) == direct.get_model_config(MODEL, version)
        listed = httpx.get(gateway.url + "/v1/models", headers=auth)
        assert listed.status_code == 200 and MODEL in {m["id"] for m in listed.json()["data"]}
    finally:
        through.close()
        direct.close()


def test_backends_agree_on_every_call(tiny_triton) -> None:  # type: ignore[no-untyped-def]
    async def both() -> None:
        over_http, over_grpc = (
            TritonHttpBackend(tiny_triton.http_url),
            TritonGrpcBackend(tiny_triton.grpc_url, 2),
        )
        try:
            for call in ("repository_index", "server_metadata"):
                assert await getattr(over_grpc, call)(timeout_s=5) == await getattr(
                    over_http, call
                )(timeout_s=5)
            for call in ("model_metadata", "model_config", "model_ready"):
                assert await getattr(over_grpc, call)(MODEL, timeout_s=5) == await getattr(
                    over_http, call
                )(MODEL, timeout_s=5)
            got = await over_grpc.infer(MODEL, [Tensor("input", ROWS)], ["output"], timeout_s=5)
            want = await over_http.infer(MODEL, [Tensor("input", ROWS)], ["output"], timeout_s=5)
            assert (
                got["output"].dtype == want["output"].dtype
                and got["output"].tobytes() == want["output"].tobytes()
            )
            stats_grpc = {m["name"]: m for m in await over_grpc.statistics(timeout_s=5)}
            stats_http = {m["name"]: m for m in await over_http.statistics(timeout_s=5)}
            for (
                name,
                entry,
            ) in stats_http.items():  # same shape and types; counts move between the calls
                assert set(stats_grpc[name]) >= {"name", "version", "inference_stats"}
                assert isinstance(stats_grpc[name]["inference_stats"]["success"]["count"], int)
                assert stats_grpc[name]["inference_count"] >= entry["inference_count"]
        finally:
            await over_http.close()
            await over_grpc.close()

    asyncio.run(both())


def test_errors_are_the_same_as_over_http(grpc_gateway) -> None:  # type: ignore[no-untyped-def]
    gateway, auth = grpc_gateway
    body = {"inputs": [{"name": "nope", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    assert (
        "nope" in api_error(httpx.post(gateway.url + INFER, json=body, headers=auth), 400).message
    )
    missing = httpx.post(gateway.url + "/v2/models/no_such_model/infer", json=body, headers=auth)
    assert "no_such_model" in api_error(missing, 404).message
    pinned = httpx.post(
        gateway.url + f"/v2/models/{MODEL}/versions/9/infer", json=body, headers=auth
    )
    assert api_error(pinned, 404)
    slow = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [5000]}]}
    assert api_error(
        httpx.post(gateway.url + "/v2/models/slow_echo/infer", json=slow, headers=auth), 504
    )
    client = http.InferenceServerClient(gateway.url.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException, match="no_such_model") as error:
            client.get_model_metadata("no_such_model", headers=auth)
        assert error.value.status() == "404"
    finally:
        client.close()


def test_an_unreachable_triton_is_a_fast_503(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton
) -> None:
    gateway = gateway_factory(
        tiny_triton.http_url, triton_protocol="grpc", triton_grpc_url=f"127.0.0.1:{reserve_port()}"
    )
    auth = create_key(gateway)[0]
    body = {
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }
    response = httpx.post(gateway.url + INFER, json=body, headers=auth, timeout=10)
    assert (
        "unreachable" in api_error(response, 503).message
        and int(response.headers["Retry-After"]) >= 1
    )
    assert httpx.get(gateway.url + "/readyz").status_code == 503
