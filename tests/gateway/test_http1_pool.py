"""The gateway's connection pool to Triton (gateway.backends.http1_pool) against a real loopback
server written with asyncio streams: reuse, what it does with closed and cancelled connections, and
answers that are not HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from gateway.backends.http1_pool import Http1Pool, UpstreamProtocolError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A loopback server that counts connections and runs ``handler`` on each."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()
        self.requests: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()
            self.closed.set()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head and body, or None at the end of the connection."""
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return None
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


@asynccontextmanager
async def upstream(handler: Callable[[Upstream], Handler]) -> AsyncIterator[tuple[Upstream, str]]:
    holder = Upstream(lambda r, w: asyncio.sleep(0))
    holder.handler = handler(holder)
    server = await asyncio.start_server(holder.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield holder, f"127.0.0.1:{port}"
    finally:
        server.close()


def echo(keep_alive: bool = True) -> Callable[[Upstream], Handler]:
    """Answers each request with its body, as Triton answers: Content-Length, keep-alive."""

    def make(up: Upstream) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    request = await up.read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if request is None:
                    return
                body = request.split(b"\r\n\r\n", 1)[1]
                extra = b"" if keep_alive else b"Connection: close\r\n"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                    + extra
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                if not keep_alive:
                    return

        return handle

    return make


async def test_answers_are_read_whole_and_connections_reused() -> None:
    async with upstream(echo()) as (up, address):
        pool = Http1Pool(address, limit=4)
        big = bytes(range(256)) * 4096  # 1 MiB: written in two parts
        for body in (b"one", big, b"three"):
            answer = await pool.post("/v2/models/m/infer", body, {"X-Test": "1"})
            assert (answer.status, answer.body) == (200, body)
            assert answer.headers["content-type"] == "application/octet-stream"
        assert up.connections == 1
        head = up.requests[0].split(b"\r\n\r\n")[0].decode()
        assert head.startswith("POST /v2/models/m/infer HTTP/1.1\r\n")
        assert f"Host: {address}" in head and "X-Test: 1" in head
        await pool.close()


async def test_concurrent_requests_open_at_most_limit_connections() -> None:
    async with upstream(echo()) as (up, address):
        pool = Http1Pool(address, limit=3)
        answers = await asyncio.gather(*(pool.post("/p", str(i).encode(), {}) for i in range(20)))
        assert [a.body for a in answers] == [str(i).encode() for i in range(20)]
        assert up.connections <= 3
        await pool.close()


async def test_a_connection_the_server_closed_is_not_reused() -> None:
    async with upstream(echo(keep_alive=False)) as (up, address):
        pool = Http1Pool(address)
        for _ in range(3):
            assert (await pool.post("/p", b"x", {})).body == b"x"
        assert up.connections == 3
        await pool.close()


async def test_cancelling_a_request_closes_its_connection() -> None:
    """How Triton learns that nobody waits: the connection of a cancelled request is closed."""

    def silent(up: Upstream) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.read_request(reader)
            await reader.read()  # returns at end of stream: the client closed

        return handle

    async with upstream(silent) as (up, address):
        pool = Http1Pool(address)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.post("/p", b"x", {})
        await asyncio.wait_for(up.closed.wait(), 5)


async def test_a_server_that_hangs_up_raises_connection_error() -> None:
    def hang_up(up: Upstream) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.read_request(reader)

        return handle

    async with upstream(hang_up) as (_, address):
        with pytest.raises(ConnectionResetError, match="closed the connection"):
            await Http1Pool(address).post("/p", b"x", {})


async def test_an_answer_that_is_not_http_raises_protocol_error() -> None:
    def garbage(up: Upstream) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.read_request(reader)
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            await writer.drain()
            await reader.read()

        return handle

    async with upstream(garbage) as (_, address):
        with pytest.raises(UpstreamProtocolError, match="not valid HTTP"):
            await Http1Pool(address).post("/p", b"x", {})


async def test_chunked_answers_are_decoded() -> None:
    def chunked(up: Upstream) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await up.read_request(reader)
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            await writer.drain()
            await reader.read()

        return handle

    async with upstream(chunked) as (_, address):
        answer = await Http1Pool(address).post("/p", b"x", {})
        assert (answer.status, answer.body) == (400, b"hello world")


async def test_an_unreachable_server_raises_os_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(OSError):
            await Http1Pool(f"127.0.0.1:{port}").post("/p", b"x", {})


def test_it_runs_on_uvloop_as_the_gateway_does() -> None:
    """uvicorn runs the gateway on uvloop where installed, whose transports are its own classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        await test_answers_are_read_whole_and_connections_reused()
        await test_cancelling_a_request_closes_its_connection()

    uvloop.run(scenario())


def test_the_address_must_name_a_port() -> None:
    with pytest.raises(ValueError, match="host:port"):
        Http1Pool("localhost")


async def test_a_connection_idle_past_the_timeout_is_closed_when_another_is_handed_back() -> None:
    async with upstream(echo()) as (up, address):
        pool = Http1Pool(address, limit=4, idle_timeout_s=0.2)
        # A burst opens two connections; both go idle.
        await asyncio.gather(*(pool.post("/p", b"x", {}) for _ in range(2)))
        assert up.connections == 2 and not up.closed.is_set()
        await asyncio.sleep(0.3)
        # The next request takes the newest; handing it back closes the one idle past the timeout.
        assert (await pool.post("/p", b"y", {})).body == b"y"
        await asyncio.wait_for(up.closed.wait(), 5)
        assert (await pool.post("/p", b"z", {})).body == b"z"
        assert up.connections == 2  # the warm one served both
        await pool.close()
