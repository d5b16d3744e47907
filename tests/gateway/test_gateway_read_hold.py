"""A key that ignores Retry-After: its connection is not read until the wait is over (real sockets).

The real gateway process with the hold on (``hold_ignored_retry_after_s``) in front of the tiny
Triton, and a "tiny" key (a burst of 4, then one token a minute); its requests have no inputs, so
its first answers are 400s, which still cost a token. On one keep-alive connection the key gets its
first 429 (told to wait), sends again at once (a second 429: it ignored the wait), and its next
request is then left unread on that connection while another key's connection is served; when the
hold ends the waiting request is answered (the keep-alive timeout, shorter than the hold, does not
close the held connection). The hold is set short (2 s) so the held request is answered within the
test.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

HOLD_S = 2.0


@pytest.fixture(scope="module")
def held(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(
        tiny_triton.http_url,
        hold_ignored_retry_after_s=HOLD_S,
        # Shorter than the hold: a held connection is not closed as idle meanwhile.
        keep_alive_timeout_s=HOLD_S / 2,
        header_timeout_s=60.0,
    )


def _request(key: str, model: str = "tiny_linear") -> bytes:
    body = b'{"inputs": []}'
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n".encode()
        + f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP answer from ``sock``: its status and head (the body is read by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the gateway closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":", 1)[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), head.lower()


def test_a_key_that_ignores_retry_after_is_not_read_until_the_wait_is_over(  # type: ignore[no-untyped-def]
    held,
) -> None:
    _, attacker = create_key(held, tier="tiny")
    _, other = create_key(held, tier="tiny")
    address = ("127.0.0.1", int(held.url.rsplit(":", 1)[1]))
    with socket.create_connection(address, timeout=30) as sock:
        statuses = []
        for _ in range(6):  # 4 tokens, then told 429, then 429 again: the Retry-After was ignored
            sock.sendall(_request(str(attacker["api_key"])))
            status, head = _answer(sock)
            statuses.append(status)
        assert statuses[:4] == [400] * 4, statuses
        assert statuses[4:] == [429, 429], statuses
        assert b"retry-after: " in head
        # The next request on this connection is not read while the hold lasts ...
        sock.sendall(_request(str(attacker["api_key"])))
        sent = time.monotonic()
        sock.settimeout(HOLD_S / 4)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        # ... while another key's connection is answered meanwhile.
        with socket.create_connection(address, timeout=30) as fresh:
            fresh.sendall(_request(str(other["api_key"])))
            assert _answer(fresh)[0] == 400
        # Once the hold is over the held request is read and answered (429 still: no token is back).
        sock.settimeout(30)
        status, _ = _answer(sock)
        assert status == 429
        assert time.monotonic() - sent >= HOLD_S * 0.9


def test_a_key_that_waits_is_never_held(held) -> None:  # type: ignore[no-untyped-def]
    """One 429 alone holds nothing: the client was told, and had not ignored it yet."""
    _, key = create_key(held, tier="tiny")
    address = ("127.0.0.1", int(held.url.rsplit(":", 1)[1]))
    with socket.create_connection(address, timeout=30) as sock:
        for _ in range(5):
            sock.sendall(_request(str(key["api_key"])))
            status, _ = _answer(sock)
        assert status == 429
    # The same key on a new connection (as a client reconnecting) is answered at once, still 429:
    # only the connection that ignored a wait is held, and this one did not.
    with socket.create_connection(address, timeout=HOLD_S / 2) as sock:
        sock.sendall(_request(str(key["api_key"])))
        assert _answer(sock)[0] == 429


def test_a_key_that_ignores_retry_after_while_its_body_still_arrives_is_answered_late(  # type: ignore[no-untyped-def]
    held,
) -> None:
    """The hold moves before the answer: the connection is not left unread with a body in flight.

    The key's refused requests use up the tokens they are charged (four 404s: the last one finds
    the bucket empty), so its next request is refused as soon as its head is read, before any of
    its body, as the isolation benchmark's big-body attacker is."""
    _, attacker = create_key(held, tier="tiny")
    address = ("127.0.0.1", int(held.url.rsplit(":", 1)[1]))
    with socket.create_connection(address, timeout=30) as sock:
        statuses = []
        for model in ["tiny_linear"] * 5 + ["no_such_model"] * 4:  # 4 tokens, told 429, 404s
            sock.sendall(_request(str(attacker["api_key"]), model))
            statuses.append(_answer(sock)[0])
        assert statuses == [400] * 4 + [429] + [404] * 4, statuses
    declared = 1024 * 1024
    with socket.create_connection(address, timeout=30) as sock:
        # Ignores the wait, on a new connection, with a body that is still arriving.
        sock.sendall(
            b"POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {attacker['api_key']}\r\n".encode()
            + f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n".encode()
            + b" " * (128 * 1024)
        )
        sent = time.monotonic()
        sock.settimeout(HOLD_S / 4)
        with pytest.raises(TimeoutError):  # not answered while the hold lasts
            sock.recv(1)
        sock.settimeout(30)
        status, head = _answer(sock)
        assert status == 429 and b"retry-after: " in head
        assert b"connection: close" in head
        assert time.monotonic() - sent >= HOLD_S * 0.9
        try:  # and the connection is closed after the answer
            assert sock.recv(65536) == b""
        except ConnectionResetError:
            pass  # the rest of the body was never read: closing resets the connection
