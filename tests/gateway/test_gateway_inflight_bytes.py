"""The real gateway bounds the body bytes one key has in flight (``TierLimit.max_inflight_bytes``):
two big bodies held open at once by one key get one 429 while another key is served, and the bytes
are given back once the admitted one is answered. Raw sockets hold a body half sent, which is how a
hostile client holds the gateway's memory."""

from __future__ import annotations

import json
import selectors
import socket

import httpx
import pytest

from tests.support.gateway_procs import create_key, tiny_request

pytestmark = pytest.mark.integration

BODY = json.dumps(tiny_request()).encode() + b" " * 40_000  # valid JSON, ~40 KB
BOUND = 60_000  # one such body fits, two do not


@pytest.fixture(scope="module")
def bounded(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    tiers = {
        "small": {"per_minute": 60_000, "burst": 1000, "max_inflight_bytes": BOUND},
        "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
    }
    return gateway_factory(tiny_triton.http_url, tier_limits=tiers)


def _half_sent(url: str, auth: dict[str, str]) -> socket.socket:
    """A request whose headers and first half of its body are sent; the rest is held back."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(
        b"POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: x\r\n"
        + b"Authorization: "
        + auth["Authorization"].encode()
        + b"\r\n"
        + b"Accept: application/problem+json\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY)
        + BODY[: len(BODY) // 2]
    )
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the answer (the socket timeout bounds the wait)."""
    chunks = []
    with sock:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def test_two_big_bodies_of_one_key_get_one_429_while_another_key_is_served(  # type: ignore[no-untyped-def]
    bounded,
) -> None:
    small, _ = create_key(bounded, tier="small")
    other, _ = create_key(bounded, tier="small")
    url = bounded.url + "/v2/models/tiny_linear/infer"
    held = [_half_sent(bounded.url, small), _half_sent(bounded.url, small)]

    # Each declared its whole length; whichever came second does not fit and is answered at once,
    # before its body is complete. The first is still waiting for its body: nothing to read on it.
    with selectors.DefaultSelector() as selector:
        for sock in held:
            selector.register(sock, selectors.EVENT_READ)
        ready = selector.select(timeout=20)
    assert len(ready) == 1, "exactly one of the two requests is answered before its body is sent"
    refused_sock = ready[0][0].fileobj
    status, problem = _read_until_closed(refused_sock)  # type: ignore[arg-type]
    assert status == 429, problem
    assert f"allows {BOUND} at once" in str(problem["detail"])

    # Another key of the same tier has its own bound: served while the first key's body is held.
    served = httpx.post(
        url, content=BODY, headers={**other, "Content-Type": "application/json"}, timeout=20
    )
    assert served.status_code == 200, served.text

    # The admitted request completes its body and is served; its bytes are given back before its
    # answer is sent, so the key's next big body fits at once.
    (admitted,) = [sock for sock in held if sock is not refused_sock]
    admitted.sendall(BODY[len(BODY) // 2 :])
    status, answer = _read_until_closed(admitted)
    assert status == 200, answer
    assert answer["outputs"][0]["name"] == "output"  # type: ignore[index]
    again = httpx.post(
        url, content=BODY, headers={**small, "Content-Type": "application/json"}, timeout=20
    )
    assert again.status_code == 200, again.text


def test_a_body_larger_than_the_bound_itself_is_413(bounded) -> None:  # type: ignore[no-untyped-def]
    small, _ = create_key(bounded, tier="small")
    response = httpx.post(
        bounded.url + "/v2/models/tiny_linear/infer",
        content=BODY + b" " * BOUND,
        headers={**small, "Content-Type": "application/json", "Accept": "application/problem+json"},
        timeout=20,
    )
    assert response.status_code == 413, response.text
    assert f"(tier 'small': {BOUND} bytes)" in response.json()["detail"]
