"""Connection caps per peer address and in total, on the real gateway process over raw sockets.

Past a cap the gateway closes the longest idle connection (of the same address for the per-peer cap,
of the address holding the most for the total cap) and serves the new one; only when none is idle is
the new connection refused 429 with Retry-After. Peers are told apart by their loopback source
address (127.0.0.2, 127.0.0.3, ...: every address of 127.0.0.0/8 is loopback); every connection goes
to 127.0.0.1. Each test gets its own gateway, so no connection of another test is counted.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from types import SimpleNamespace

import pytest

from gateway.http.connection_caps import PeerCounts, idle_victim
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 8
PER_PEER = 6
Address = tuple[str, int]


@pytest.fixture
def capped(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    # Deadlines far longer than a test, so no connection is closed by a timeout meanwhile.
    gateway = gateway_factory(
        tiny_triton.http_url,
        max_connections=MAX_CONNECTIONS,
        max_connections_per_peer=PER_PEER,
        header_timeout_s=60.0,
        body_timeout_s=60.0,
        keep_alive_timeout_s=60.0,
    )
    return gateway, ("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _connect(address: Address, source: str, stack: ExitStack) -> socket.socket:
    sock = stack.enter_context(
        socket.create_connection(address, timeout=20, source_address=(source, 0))
    )
    return sock


def _busy(address: Address, source: str, auth: dict[str, str], stack: ExitStack) -> socket.socket:
    """A connection in the middle of a request: its head is read (the gateway said 100 Continue) and
    its body never comes."""
    sock = _connect(address, source, stack)
    sock.sendall(
        b"POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + auth["Authorization"].encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 100"), head
    return sock


def _get(address: Address, source: str, stack: ExitStack) -> bytes:
    """GET /healthz on a new connection from ``source``; everything the gateway sends until it closes."""
    sock = _connect(address, source, stack)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _closed_by_gateway(held: list[socket.socket]) -> list[int]:
    """Which of ``held`` the gateway has closed (an end of stream, no byte before it)."""
    readable, _, _ = select.select(held, [], [], 10.0)
    closed = []
    for sock in readable:
        assert sock.recv(4096) == b"", "an idle connection was answered instead of closed"
        closed.append(held.index(sock))
    return sorted(closed)


def _problem(answer: bytes, status: int) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"content-type: application/problem+json" in head.lower()
    return json.loads(body)  # type: ignore[no-any-return]


def test_a_peer_over_its_cap_loses_its_longest_idle_connection(  # type: ignore[no-untyped-def]
    capped, sockets
) -> None:
    _, address = capped
    held = [_connect(address, "127.0.0.3", sockets) for _ in range(PER_PEER)]
    assert _get(address, "127.0.0.3", sockets).startswith(b"HTTP/1.1 200")
    assert _closed_by_gateway(held) == [0]


def test_a_peer_over_its_cap_with_nothing_idle_is_refused_and_others_are_served(  # type: ignore[no-untyped-def]
    capped, sockets
) -> None:
    gateway, address = capped
    auth, _ = create_key(gateway)
    for _ in range(PER_PEER):
        _busy(address, "127.0.0.2", auth, sockets)
    answer = _get(address, "127.0.0.2", sockets)
    assert b"retry-after: 1" in answer.lower()
    assert f"this address already holds {PER_PEER} connections" in str(
        _problem(answer, 429)["detail"]
    )
    assert _get(address, "127.0.0.1", sockets).startswith(b"HTTP/1.1 200")


def test_at_the_total_cap_the_busiest_peer_loses_its_longest_idle_connection(  # type: ignore[no-untyped-def]
    capped, sockets
) -> None:
    _, address = capped
    heavy = [_connect(address, "127.0.0.4", sockets) for _ in range(5)]
    light = [_connect(address, "127.0.0.5", sockets) for _ in range(MAX_CONNECTIONS - 5)]
    assert _get(address, "127.0.0.1", sockets).startswith(b"HTTP/1.1 200")
    assert _closed_by_gateway(heavy + light) == [0]


def test_at_the_total_cap_with_nothing_idle_new_connections_get_429_until_one_ends(  # type: ignore[no-untyped-def]
    capped, sockets
) -> None:
    gateway, address = capped
    auth, _ = create_key(gateway)
    busy = [_busy(address, "127.0.0.6", auth, sockets) for _ in range(PER_PEER)]
    busy += [_busy(address, "127.0.0.7", auth, sockets) for _ in range(MAX_CONNECTIONS - PER_PEER)]
    answer = _get(address, "127.0.0.1", sockets)
    assert b"retry-after: 1" in answer.lower()
    assert f"already holds {MAX_CONNECTIONS} connections and none is idle" in str(
        _problem(answer, 429)["detail"]
    )
    for sock in busy:
        sock.close()
    for _ in range(50):  # the gateway notices the closed connections; a new one is then served
        if _get(address, "127.0.0.1", sockets).startswith(b"HTTP/1.1 200"):
            break
    else:
        pytest.fail("the gateway never accepted a connection again")


def test_the_victim_is_the_longest_idle_of_the_peer_holding_the_most() -> None:
    counts = PeerCounts()
    for peer in ("a", "a", "a", "b", "b"):
        counts.add(peer)
    a_old, a_new, a_busy = (
        SimpleNamespace(peer="a", idle_since=lambda t=t: t) for t in (2.0, 5.0, None)
    )
    b_oldest = SimpleNamespace(peer="b", idle_since=lambda: 1.0)
    connections = [a_new, a_busy, b_oldest, a_old]
    assert idle_victim(connections, counts) is a_old  # "a" holds the most
    assert idle_victim(connections, counts, peer="b") is b_oldest
    assert idle_victim(connections, counts, peer="a", exclude=a_old) is a_new
    assert idle_victim([a_busy], counts) is None
    counts.remove("b")
    counts.remove("b")
    assert counts["b"] == 0 and len(counts) == 1
