"""Big OpenAI JSON bodies through the real gateway: decoded in its parse processes (not on the event
loop of the process that serves everyone) and answered exactly as the same body without the bulk.

The bulk is whitespace inside the document (valid JSON the decoder reads through), so a big body
means the same as its small twin and the answers can be compared whole. ``tiny_triton`` serves no
embedding or image model: the answers are the gateway's own (404 for the model, 400 for the body),
given after the body was decoded and validated.
"""

from __future__ import annotations

import httpx
import psutil
import pytest

from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

PADDING = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def pooled(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    gateway = gateway_factory(tiny_triton.http_url, parse_workers=1, workers=1)
    auth, _ = create_key(gateway)
    return gateway, auth


def _parse_workers(gateway) -> list[psutil.Process]:  # type: ignore[no-untyped-def]
    # One gateway process (workers=1): its parse processes are its spawned children, started for
    # the first body sent to them.
    children = psutil.Process(gateway.process.pid).children()
    return [c for c in children if "multiprocessing.spawn" in " ".join(c.cmdline())]


def _post(gateway, auth, path: str, body: bytes) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(
        gateway.url + path,
        content=body,
        headers={**auth, "Content-Type": "application/json"},
        timeout=60,
    )


def _padded(body: bytes) -> bytes:
    return body.replace(b"{", b"{" + b" " * PADDING, 1)


CASES = [
    ("/v1/embeddings", b'{"model": "text_embedding", "input": ["a", "b"]}', 404),
    ("/v1/embeddings", b'{"model": "text_embedding", "input": [[1, 2], [3]]}', 404),
    ("/v1/images/generations", b'{"prompt": "a fox", "size": "64x64"}', 404),
    ("/v1/embeddings", b'{"model": "text_embedding"}', 400),  # no input
    (
        "/v1/embeddings",
        b'{"model": "text_embedding", "input": ["a"], "encoding_format": "hex"}',
        400,
    ),
    ("/v1/images/generations", b'{"prompt": "x", "size": "big"}', 400),
]


def test_big_bodies_are_decoded_in_a_parse_process_and_answered_as_small_ones(  # type: ignore[no-untyped-def]
    pooled,
) -> None:
    gateway, auth = pooled
    expected = []
    for path, small, status in CASES:
        answer = _post(gateway, auth, path, small)
        assert answer.status_code == status, answer.text
        expected.append(answer.json())
    assert not _parse_workers(gateway), "a small body was sent to a parse process"
    for (path, small, status), want in zip(CASES, expected, strict=True):
        big = _padded(small)
        assert len(big) > PADDING
        answer = _post(gateway, auth, path, big)
        assert answer.status_code == status, answer.text
        assert answer.json() == want
    assert _parse_workers(gateway), "the big bodies were decoded in a parse process"


def test_a_big_body_that_is_not_json_gets_the_same_400(pooled) -> None:  # type: ignore[no-untyped-def]
    gateway, auth = pooled
    small = _post(gateway, auth, "/v1/embeddings", b"{not json")
    big = _post(gateway, auth, "/v1/embeddings", _padded(b"{not json"))
    assert small.status_code == big.status_code == 400, big.text
    assert big.json()["error"]["param"] == small.json()["error"]["param"] == "body"
    assert big.json()["error"]["code"] == small.json()["error"]["code"]
    # Not text in any JSON encoding: FastAPI's own 400 either way.
    small = _post(gateway, auth, "/v1/embeddings", b'{"model": "\xff"}')
    big = _post(gateway, auth, "/v1/embeddings", _padded(b'{"model": "\xff"}'))
    assert small.status_code == big.status_code == 400, big.text
    assert big.json() == small.json()
