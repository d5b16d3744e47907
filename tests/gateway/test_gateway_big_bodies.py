"""Big KServe v2 JSON bodies through the real gateway: parsed in its parse processes (not in the
process that serves everyone), answered exactly as a small body is, and refused with the same 400
when malformed."""

from __future__ import annotations

import json

import httpx
import numpy as np
import psutil
import pytest

from gateway.errors import BadRequest
from gateway.protocol.kserve import parse_rest
from tests.support.gateway_procs import create_key, tiny_request
from tests.support.tiny_repo import TINY_BIAS, TINY_WEIGHT

pytestmark = pytest.mark.integration

ROWS = 8  # tiny_linear's max_batch_size
PADDING = 3 * 1024 * 1024  # whitespace: valid JSON the parser reads through, as it does numbers


@pytest.fixture(scope="module")
def big(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(tiny_triton.http_url, parse_workers=1, workers=1)


def _parse_workers(gateway) -> list[psutil.Process]:  # type: ignore[no-untyped-def]
    # One gateway process (workers=1) serves: its parse processes are its own spawned children.
    children = psutil.Process(gateway.process.pid).children()
    return [c for c in children if "multiprocessing.spawn" in " ".join(c.cmdline())]


def _body(rows: np.ndarray) -> bytes:
    document = tiny_request(len(rows))
    document["inputs"][0]["data"] = rows.tolist()  # type: ignore[index]
    # Padding inside the document (between keys), so the whole body is parsed, not skipped.
    text = json.dumps(document)
    return text.replace('"inputs":', '"inputs":' + " " * PADDING, 1).encode()


def test_a_big_body_is_parsed_in_a_worker_process_and_served(big) -> None:  # type: ignore[no-untyped-def]
    auth, _ = create_key(big)
    rows = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4) / 7
    body = _body(rows)
    assert len(body) > PADDING
    response = httpx.post(
        big.url + "/v2/models/tiny_linear/infer",
        content=body,
        headers={**auth, "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["shape"] == [ROWS, 2]
    np.testing.assert_allclose(
        np.array(output["data"], dtype=np.float32).reshape(ROWS, 2),
        rows @ TINY_WEIGHT + TINY_BIAS,
        rtol=1e-5,
    )
    assert _parse_workers(big), "the body was parsed in a parse process of the gateway"


@pytest.mark.parametrize(
    "spoil",
    [
        lambda body: body + b"}",  # trailing data
        lambda body: body.replace(b'"FP32"', b'"FP32", "datatype": "FP16"'),  # a duplicate key
        lambda body: body.replace(b"[8, 4]", b"[8, 5]"),  # data short of the shape
    ],
    ids=["trailing-data", "duplicate-key", "short-data"],
)
def test_a_malformed_big_body_gets_the_same_400(big, spoil) -> None:  # type: ignore[no-untyped-def]
    auth, _ = create_key(big)
    body = spoil(_body(np.ones((ROWS, 4), dtype=np.float32)))
    assert body != _body(np.ones((ROWS, 4), dtype=np.float32))
    with pytest.raises(BadRequest) as expected:  # what the parse says in process
        parse_rest(body)
    response = httpx.post(
        big.url + "/v2/models/tiny_linear/infer",
        content=body,
        headers={**auth, "Content-Type": "application/json", "Accept": "application/problem+json"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["detail"] == expected.value.detail
    assert problem["field"] == expected.value.field
