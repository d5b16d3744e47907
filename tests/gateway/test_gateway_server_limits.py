"""Connection limits of the real gateway process, driven over raw sockets (what an attacker uses):
header size and count, header and body read deadlines, keep-alive limits (the connection caps:
test_gateway_connection_caps.py)."""

from __future__ import annotations

import json
import socket

import psutil
import pytest

from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 12
LIMITS = {
    "max_header_bytes": 16 * 1024,
    "max_header_count": 40,
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.0,
    "max_connections": MAX_CONNECTIONS,
    "max_requests_per_connection": 3,
    "keep_alive_timeout_s": 1.0,
}


@pytest.fixture(scope="module")
def limited(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    gateway = gateway_factory(tiny_triton.http_url, **LIMITS)
    return gateway, ("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=20)


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection (the socket timeout bounds it)."""
    chunks = []
    with sock:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _problem(answer: bytes, status: int) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"content-type: application/problem+json" in head.lower()
    document = json.loads(body)
    assert document["status"] == status
    return document  # type: ignore[no-any-return]


def test_a_64_mb_header_is_refused_without_being_buffered(limited) -> None:  # type: ignore[no-untyped-def]
    gateway, address = limited
    process = psutil.Process(gateway.process.pid)
    before = process.memory_info().rss
    sock = _connect(address)
    try:
        sock.sendall(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 20) + b"\r\n\r\n"
        )
    except OSError:  # the gateway may close before the last byte; its answer is still readable
        pass
    problem = _problem(_read_until_closed(sock), 431)
    assert "larger than 16384 bytes" in str(problem["detail"])
    assert process.memory_info().rss - before < 32 << 20, "the header was buffered"


def test_too_many_header_fields_are_refused(limited) -> None:  # type: ignore[no-untyped-def]
    _, address = limited
    sock = _connect(address)
    fields = b"".join(b"X-Field-%d: 1\r\n" % i for i in range(41))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert "more than 40 header fields" in str(_problem(_read_until_closed(sock), 431)["detail"])


def test_half_sent_heads_and_silent_connections_are_closed(limited) -> None:  # type: ignore[no-untyped-def]
    _, address = limited
    half = _connect(address)
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
    silent = _connect(address)  # never sends a byte
    for sock in (half, silent):
        assert "did not arrive within 1 s" in str(_problem(_read_until_closed(sock), 408)["detail"])


def test_half_sent_bodies_are_answered_408_and_closed(limited) -> None:  # type: ignore[no-untyped-def]
    gateway, address = limited
    auth, _ = create_key(gateway)
    sock = _connect(address)
    sock.sendall(
        b"POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + auth["Authorization"].encode()
        + b'\r\nContent-Length: 1000\r\n\r\n{"inputs": ['
    )
    problem = _problem(_read_until_closed(sock), 408)
    assert "body did not arrive" in str(problem["detail"])
    assert problem["instance"] == "/v2/models/tiny_linear/infer"


def test_keep_alive_connections_serve_a_bounded_number_of_requests(  # type: ignore[no-untyped-def]
    limited,
) -> None:
    _, address = limited
    sock = _connect(address)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 5)
    answer = _read_until_closed(sock)
    assert answer.count(b"HTTP/1.1 200") == 3 and b"connection: close" in answer.lower()


def test_a_body_sent_after_an_early_answer_does_not_hold_the_connection(  # type: ignore[no-untyped-def]
    limited,
) -> None:
    # Refused before its body is read (401), then the body arrives: uvicorn alone kept such a
    # connection open forever; it is closed once idle, like any keep-alive connection.
    _, address = limited
    sock = _connect(address)
    sock.sendall(
        b"POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
    )
    answer = b""
    while b"\r\n\r\n" not in answer:  # the 401 comes first; only then does the body follow
        answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401")
    sock.sendall(b"x" * 5000)
    _read_until_closed(
        sock
    )  # returns once the gateway closes the idle connection (else: socket timeout)


def test_ordinary_requests_with_large_allowed_headers_pass(limited) -> None:  # type: ignore[no-untyped-def]
    _, address = limited
    sock = _connect(address)
    sock.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Token: "
        + b"t" * 8000
        + b"\r\nConnection: close\r\n\r\n"
    )
    assert _read_until_closed(sock).startswith(b"HTTP/1.1 200")


def test_head_bytes_are_counted_up_to_the_blank_line_across_reads() -> None:
    from types import SimpleNamespace

    from gateway.http.limits import LimitedHttpToolsProtocol

    count = LimitedHttpToolsProtocol._head_part
    state = SimpleNamespace(_head_tail=b"")
    assert (
        count(state, b"POST / HTTP/1.1\r\nA: b\r\n\r\n" + b"x" * 1000) == 25
    )  # the body is not head
    state = SimpleNamespace(_head_tail=b"")
    head = b"GET / HTTP/1.1\r\nA: b\r\n\r\n"
    reads = [head[:10], head[10:23], head[23:] + b"next"]  # the blank line split across reads
    assert sum(count(state, read) for read in reads) == len(head)


def test_chunked_trailers_never_become_headers(limited) -> None:  # type: ignore[no-untyped-def]
    # The route reads Inference-Header-Content-Length after the body: were the trailer merged into
    # the headers, this plain JSON body would be split at byte 3 and refused (400).
    gateway, address = limited
    auth, _ = create_key(gateway)
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).encode()
    sock = _connect(address)
    sock.sendall(
        b"POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + auth["Authorization"].encode()
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        + b"%x\r\n" % len(body)
        + body
        + b"\r\n0\r\n"
        + b"Inference-Header-Content-Length: 3\r\nContent-Encoding: gzip\r\n\r\n"
    )
    answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:400]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]["name"] == "output"


@pytest.fixture(scope="module")
def tiered(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    tiers = {
        "small": {"per_minute": 6000, "burst": 100, "max_body_bytes": 1000},
        "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
    }
    return gateway_factory(tiny_triton.http_url, tier_limits=tiers)


def test_a_tiers_body_cap_is_enforced_while_reading(tiered) -> None:  # type: ignore[no-untyped-def]
    import httpx

    good = b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'
    padded = good + b" " * 4000  # valid JSON, 4 KB: over the small tier's 1000 bytes
    small, _ = create_key(tiered, tier="small")
    large, _ = create_key(tiered, tier="unlimited")
    url = tiered.url + "/v2/models/tiny_linear/infer"
    problem_headers = {"Accept": "application/problem+json", "Content-Type": "application/json"}

    def chunks():  # no Content-Length: counted as it arrives
        for start in range(0, len(padded), 500):
            yield padded[start : start + 500]

    for content in (padded, chunks()):
        response = httpx.post(
            url, content=content, headers={**small, **problem_headers}, timeout=20
        )
        assert response.status_code == 413, response.text
        assert "limit of tier 'small' of 1000 bytes" in response.json()["detail"]
        assert response.json()["field"] == "body"
    assert (
        httpx.post(url, content=good, headers={**small, **problem_headers}, timeout=20).status_code
        == 200
    )
    assert (
        httpx.post(
            url, content=padded, headers={**large, **problem_headers}, timeout=20
        ).status_code
        == 200
    )
