"""Keep-alive HTTP/1.1 connections to Triton for the inference hop, on asyncio protocols and
httptools (the parser uvicorn already runs the gateway's side on).

Why not aiohttp, which tritonclient's aio client runs on: the hop to Triton is one request shape
(a POST of bytes already encoded, an answer passed back as bytes), and aiohttp's general client
(sessions, cookie jars, redirects, tracing hooks, stream readers, multidicts) was the largest part of
the gateway's CPU per request: about 0.33 of the 0.39 ms a bare ASGI proxy costs
(``inferctl bench gateway-profile --floors``). That CPU is paid on every request, in the event loop
that serves every tenant, so it is latency too. The other calls to Triton (metadata, readiness,
repository, statistics) stay on tritonclient.

What it does and does not do:

- one request per connection at a time (no pipelining), at most ``limit`` connections; a request
  past the limit waits for a free one;
- an idle connection that Triton closed is noticed when it closes (``connection_lost``) and never
  reused; a request that fails on a connection never retries, since an inference is not idempotent
  and Triton may have run it;
- a request cancelled while in flight (the client left, the deadline passed) closes its connection,
  which is how Triton's HTTP front end learns that nobody waits for the answer;
- answers are read whole (Triton answers with ``Content-Length``; chunked answers are decoded too);
- a request's head and body go out in one ``writelines`` (one ``writev`` on uvloop, the body not
  copied);
- a connection idle for ``idle_timeout_s`` is closed when the pool next hands one back, so a burst
  does not leave ``limit`` connections per worker open on Triton for good (aiohttp closed them
  after 15 s too); no timer per connection.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

import httptools

__all__ = ["Http1Pool", "Http1Response", "UpstreamProtocolError"]


class UpstreamProtocolError(Exception):
    """Triton's answer was not valid HTTP/1.1."""


@dataclass(frozen=True)
class Http1Response:
    """An answer read whole: status, headers (names lower-case, latin-1) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection; :meth:`exchange` sends a request and waits for its answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser: httptools.HttpResponseParser | None = None
        self._answer: asyncio.Future[Http1Response] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.idle_since = 0.0  # time.monotonic() when last handed back to the pool

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, though they do all it does
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes nobody asked for: the connection can't be trusted
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"Triton's answer is not valid HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionResetError("Triton closed the connection before answering"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser, answer = self._parser, self._answer
        if parser is None or answer is None or answer.done():
            return
        if not parser.should_keep_alive():
            self.closed = True  # the pool closes it once the answer is taken
        self._parser = None
        answer.set_result(
            Http1Response(parser.get_status_code(), self._headers, b"".join(self._body))
        )
        # Fresh ones: bytes after the answer in the same read must not reach the one handed out.
        self._headers, self._body = {}, []

    async def exchange(self, head: bytes, body: bytes) -> Http1Response:
        """Send one request (``head`` ends with the blank line) and wait for the whole answer."""
        assert self.transport is not None
        self._headers, self._body = {}, []
        self._parser = httptools.HttpResponseParser(self)
        self._answer = asyncio.get_running_loop().create_future()
        self.transport.writelines((head, body))
        return await self._answer

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)


class Http1Pool:
    """At most ``limit`` keep-alive connections to ``address``, reused one request at a time.

    Args:
        address: ``host:port`` of Triton's HTTP endpoint (an IPv6 host in brackets).
        limit: most connections open at once; requests past it wait for one.
        idle_timeout_s: an idle connection older than this is closed (see the module docstring).
    """

    def __init__(self, address: str, limit: int = 64, idle_timeout_s: float = 15.0) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected host:port, got {address!r}")
        self._address = (host.strip("[]"), int(port))
        self._host_header = f"Host: {address}\r\n".encode("latin-1")
        # Oldest idle first: requests take the newest (the warmest), so the oldest age out.
        self._idle: deque[_Connection] = deque()
        self._idle_timeout_s = idle_timeout_s
        self._slots = asyncio.Semaphore(limit)

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Http1Response:
        """POST ``body`` to ``path`` with ``headers`` (``Content-Length`` is added) and read the answer.

        Raises:
            OSError: Triton could not be reached, or closed the connection before answering.
            UpstreamProtocolError: the answer was not valid HTTP/1.1.
        """
        lines = [f"POST {path} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        lines += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1"))
        head = b"".join(lines)
        async with self._slots:
            connection = self._idle_connection() or await self._connect()
            try:
                answer = await connection.exchange(head, body)
            except BaseException:
                connection.close()  # cancelled or failed: its state is unknown, never reuse it
                raise
            if connection.closed:
                connection.close()
            else:
                self._hand_back(connection)
            return answer

    def _hand_back(self, connection: _Connection) -> None:
        now = time.monotonic()
        connection.idle_since = now
        idle = self._idle
        while idle and now - idle[0].idle_since > self._idle_timeout_s:
            idle.popleft().close()
        idle.append(connection)

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(_Connection, *self._address)
        return connection

    async def close(self) -> None:
        """Close every idle connection (those in use close when their request ends)."""
        idle, self._idle = self._idle, deque()
        for connection in idle:
            connection.close()
