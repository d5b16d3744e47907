"""KServe v2 through the real gateway to the real Triton: tritonclient works unchanged, Triton runs
exactly what the gateway checked, compressed bodies are decoded under the cap, and no answer shows
Triton's internals."""

from __future__ import annotations

import gzip
import zlib

import httpx
import numpy as np
import pytest
import tritonclient.http as http

pytestmark = pytest.mark.integration

INFER = "/v2/models/tiny_linear/infer"
GOOD = b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'


@pytest.fixture(scope="module")
def headers(admin) -> dict[str, str]:  # type: ignore[no-untyped-def]
    # /v2 errors are KServe's {"error": "..."} by default; these tests read the named field from the
    # problem document a client gets by asking for one.
    return {**admin.headers(admin.create_key()), "Accept": "application/problem+json"}


def _infer(url: str, headers: dict[str, str], binary: bool, compression: str | None) -> np.ndarray:
    client = http.InferenceServerClient(url)
    try:
        tensor = http.InferInput("input", [3, 4], "FP32")
        tensor.set_data_from_numpy(
            np.arange(12, dtype=np.float32).reshape(3, 4) / 7, binary_data=binary
        )
        result = client.infer(
            "tiny_linear",
            [tensor],
            outputs=[http.InferRequestedOutput("output", binary_data=binary)],
            headers=dict(headers),  # tritonclient adds its own headers to the dict it is given
            request_compression_algorithm=compression,
            response_compression_algorithm=compression,
        )
        return result.as_numpy("output")  # type: ignore[no-any-return]
    finally:
        client.close()


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_through_the_gateway_matches_direct_triton(
    gateway,
    tiny_triton,
    headers,
    binary: bool,
    compression: str | None,  # type: ignore[no-untyped-def]
) -> None:
    through = _infer(gateway.url.removeprefix("http://"), headers, binary, compression)
    direct = _infer(tiny_triton.http_url, {}, binary, compression)
    assert through.dtype == np.float32 and through.tobytes() == direct.tobytes()


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()  # type: ignore[no-any-return]


def test_duplicate_keys_never_reach_triton(gateway, headers) -> None:  # type: ignore[no-untyped-def]
    # Triton keeps the first "inputs", Python the last: the gateway refuses the ambiguity.
    body = (
        GOOD[:-1]
        + b', "inputs": [{"name": "input", "shape": [1000000000, 4], "datatype": "FP32", "data": []}]}'
    )
    problem = _problem(httpx.post(gateway.url + INFER, content=body, headers=headers), 400)
    assert "repeats the key 'inputs'" in str(problem["detail"]) and problem["field"] == "inputs"


def test_compressed_bodies_are_capped_after_decoding(  # type: ignore[no-untyped-def]
    gateway, headers
) -> None:
    url = gateway.url + INFER
    bomb = gzip.compress(
        b" " * 20_000_000
    )  # 20 KB that decode to 20 MB; the gateway's cap is 64 KB
    problem = _problem(
        httpx.post(url, content=bomb, headers={**headers, "Content-Encoding": "gzip"}), 413
    )
    assert "decompresses to more than" in str(problem["detail"])
    for encoding in ("br", "zstd", "gzip, gzip", "compress"):
        problem = _problem(
            httpx.post(url, content=GOOD, headers={**headers, "Content-Encoding": encoding}), 415
        )
        assert problem["field"] == "Content-Encoding"
    corrupt = _problem(
        httpx.post(url, content=GOOD, headers={**headers, "Content-Encoding": "deflate"}), 400
    )
    assert "not valid deflate" in str(corrupt["detail"])
    ok = httpx.post(
        url, content=zlib.compress(GOOD), headers={**headers, "Content-Encoding": "deflate"}
    )
    assert ok.status_code == 200 and ok.json()["outputs"][0]["name"] == "output"


def test_no_answer_shows_tracebacks_or_paths(gateway, headers) -> None:  # type: ignore[no-untyped-def]
    # slow_echo raises inside the Python backend on a negative delay: Triton's message carries the
    # exception and the model file's path; the client sees neither.
    body = b'{"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [-5]}]}'
    response = httpx.post(gateway.url + "/v2/models/slow_echo/infer", content=body, headers=headers)
    problem = _problem(response, 502)
    text = response.text
    assert "slow_echo" in str(problem["detail"]) and "X-Request-ID" in str(problem["detail"])
    for secret in ("model.py", "At:", "ValueError", "/tmp", "sleep length"):
        assert secret not in text, text
    assert "sleep length must be non-negative" in gateway.log()  # the operator still has it
    shape = (
        b'{"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}'
    )
    problem = _problem(httpx.post(gateway.url + INFER, content=shape, headers=headers), 400)
    assert (
        "unexpected shape for input 'input'" in str(problem["detail"])
        and problem["field"] == "inputs.input"
    )
    assert "request id" not in str(problem["detail"])


_TRITON_ONLY = [
    ("request", "shared_memory_region", "r"),
    ("request", "shared_memory_byte_size", 16),
    ("request", "shared_memory_offset", 0),
    ("request", "sequence_id", 7),
    ("request", "sequence_start", True),
    ("request", "sequence_end", True),
    ("request", "priority", 1),
    ("inputs.0", "shared_memory_region", "r"),
    ("inputs.0", "sequence_id", 7),
    ("inputs.0", "priority", 1),
    ("inputs.0", "timeout", 100),
    ("outputs.0", "shared_memory_offset", 0),
    ("outputs.0", "sequence_end", True),
    ("outputs.0", "priority", 1),
    ("outputs.0", "timeout", 100),
]


@pytest.mark.parametrize(("where", "name", "value"), _TRITON_ONLY)
def test_triton_only_parameters_are_refused_naming_the_field(
    gateway,
    headers,
    where: str,
    name: str,
    value: object,  # type: ignore[no-untyped-def]
) -> None:
    import json

    document: dict[str, object] = json.loads(GOOD)
    document["outputs"] = [{"name": "output"}]
    target = document if where == "request" else document[where.split(".")[0]][0]  # type: ignore[index]
    target["parameters"] = {name: value}  # type: ignore[index]
    response = httpx.post(gateway.url + INFER, content=json.dumps(document), headers=headers)
    problem = _problem(response, 400)
    prefix = "" if where == "request" else where + "."
    assert problem["field"] == f"{prefix}parameters.{name}", problem
