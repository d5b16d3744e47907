"""The accept rate per peer address, on the real gateway process over raw sockets.

A peer address past its burst of new connections gets a canned 429 (problem+json, Retry-After) at
accept, before any parsing, and the connection is closed; other addresses are served. Peers are told
apart by their loopback source address (127.0.0.0/8 is all loopback); every connection goes to
127.0.0.1. The gateway's own start-up probes come from 127.0.0.1, so the tests use other addresses.
The rate is one connection per 1,000 s: no token comes back while a test runs, whatever the load.
No Triton is needed (``/healthz`` is the gateway's own liveness), so the gateway points at a closed port.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from gateway.http.accept_rate import AcceptRate
from tests.support.fake_clock import FakeClock

pytestmark = pytest.mark.integration

BURST = 3
Address = tuple[str, int]


@pytest.fixture(scope="module")
def rated(gateway_factory):  # type: ignore[no-untyped-def]
    # Deadlines far longer than a test, so no held connection is closed by a timeout meanwhile.
    gateway = gateway_factory(
        "127.0.0.1:9",
        accept_rate_per_s=0.001,
        accept_burst=BURST,
        max_connections_per_peer=BURST,
        header_timeout_s=60.0,
        keep_alive_timeout_s=60.0,
    )
    return ("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))


def _get(address: Address, source: str) -> bytes:
    """GET /healthz on a new connection from ``source``, sent at once; all the gateway sends until
    it closes."""
    with socket.create_connection(address, timeout=20, source_address=(source, 0)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _problem(answer: bytes, status: int) -> tuple[bytes, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"content-type: application/problem+json" in head.lower()
    return head.lower(), json.loads(body)


def test_a_peer_past_its_burst_gets_a_canned_429_and_other_peers_are_served(  # type: ignore[no-untyped-def]
    rated,
) -> None:
    # Each connection is closed before the next: the burst counts connections opened, not held.
    for _ in range(BURST):
        assert _get(rated, "127.0.0.2").startswith(b"HTTP/1.1 200")
    head, problem = _problem(_get(rated, "127.0.0.2"), 429)
    assert b"retry-after: " in head and b"connection: close" in head
    assert int(head.split(b"retry-after: ")[1].split(b"\r\n")[0]) >= 1
    assert "opens connections faster" in str(problem["detail"])
    # The refusal is read although the request was sent before the gateway closed (no reset).
    for _ in range(5):
        _problem(_get(rated, "127.0.0.2"), 429)
    assert _get(rated, "127.0.0.3").startswith(b"HTTP/1.1 200")


def test_refused_connections_never_count_against_the_connection_caps(  # type: ignore[no-untyped-def]
    rated,
) -> None:
    held = [
        socket.create_connection(rated, timeout=20, source_address=("127.0.0.4", 0))
        for _ in range(BURST)
    ]
    try:
        for _ in range(BURST * 3):  # refused at accept, so the address's cap is never reached
            _, problem = _problem(_get(rated, "127.0.0.4"), 429)
            assert "opens connections faster" in str(problem["detail"])
        held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()


HOLD_S = 6.0  # the margin the checks of "not answered yet" have on a busy machine


@pytest.fixture(scope="module")
def holding(gateway_factory):  # type: ignore[no-untyped-def]
    # No token ever comes back (one per 1,000 s), so every refused connection of an address is held
    # the whole HOLD_S; two held connections at most (max_connections bounds them).
    gateway = gateway_factory(
        "127.0.0.1:9",
        accept_rate_per_s=0.001,
        accept_burst=1,
        hold_ignored_retry_after_s=HOLD_S,
        max_connections=2,
        header_timeout_s=60.0,
        keep_alive_timeout_s=60.0,
    )
    return ("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))


def _send(address: Address, source: str) -> socket.socket:
    sock = socket.create_connection(address, timeout=20, source_address=(source, 0))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def test_a_peer_that_keeps_coming_back_is_answered_only_when_it_may_connect_again(  # type: ignore[no-untyped-def]
    holding,
) -> None:
    assert _get(holding, "127.0.0.5").startswith(b"HTTP/1.1 200")  # its burst
    started = time.monotonic()
    held = [_send(holding, "127.0.0.5") for _ in range(2)]
    # Past the bound of held connections: answered at once, while the two held wait.
    _, problem = _problem(_get(holding, "127.0.0.5"), 429)
    assert "opens connections faster" in str(problem["detail"])
    for sock in held:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing answered yet, and not closed
            sock.recv(1)
        sock.setblocking(True)
    for sock in held:
        head, _ = _problem(_read_all(sock), 429)
        assert b"retry-after: " in head
    # Held the whole HOLD_S (a lower bound: a timer never fires early), then answered and closed.
    assert time.monotonic() - started >= HOLD_S - 0.1
    assert _get(holding, "127.0.0.6").startswith(b"HTTP/1.1 200")  # another address is served


def test_refused_connections_cost_a_token_up_to_the_debt_bound() -> None:
    clock = FakeClock(100.0)
    rate = AcceptRate(10.0, 1, max_debt_s=0.5, clock=clock)
    assert rate.admit("a") == 0.0
    waits = [rate.admit("a") for _ in range(20)]  # each refusal pushes the next arrival back
    assert waits[:5] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert max(waits) == pytest.approx(0.5)  # the debt is bounded
    assert rate.wait_of("a") == pytest.approx(0.5)
    clock.now += 0.5  # a client that waits as told is served
    assert rate.admit("a") == 0.0
    assert rate.wait_of("b") == 0.0


def test_the_bucket_allows_a_burst_then_the_rate() -> None:
    clock = FakeClock(100.0)
    rate = AcceptRate(10.0, 4, clock=clock)
    assert [rate.admit("a") for _ in range(4)] == [0.0] * 4
    wait = rate.admit("a")
    assert wait == pytest.approx(0.1)
    assert rate.retry_after_s(wait) == 1
    assert rate.admit("b") == 0.0  # another address has its own bucket
    clock.now += 0.1
    assert rate.admit("a") == 0.0
    assert rate.admit("a") > 0
    clock.now += 0.4  # refilled: a whole burst again
    assert [rate.admit("a") for _ in range(4)] == [0.0] * 4


def test_refilled_buckets_are_dropped_and_the_table_is_bounded() -> None:
    clock = FakeClock(100.0)
    rate = AcceptRate(10.0, 2, max_peers=50, clock=clock)
    for i in range(20):
        rate.admit(f"10.0.0.{i}")
    clock.now += 1.0  # every bucket has refilled: each new check drops old ones
    for i in range(20):
        rate.admit(f"10.0.1.{i}")
    assert len(rate) <= 21
    for i in range(500):  # all at once, none refilled: the cap holds
        rate.admit(f"10.0.2.{i}")
    assert len(rate) == 50
    off = AcceptRate(0, 1)
    assert not off.enabled and off.admit("a") == 0.0 and len(off) == 0
