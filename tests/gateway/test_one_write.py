"""A response with a Content-Length leaves in one write (gateway.http.one_write), driven through
uvicorn's own RequestResponseCycle; and the server protocol's disconnect callback, through a real
uvicorn server on a loopback socket."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.limits import uvicorn_options
from gateway.http.middleware import DisconnectMiddleware
from gateway.http.one_write import HeadWithBody
from gateway.http.server_limits import ServerLimits
from gateway.settings import GatewaySettings


class _Transport:
    """Records what is written, one entry a call (``writelines`` as one entry)."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.calls.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _cycle(
    transport: _Transport, *, method: str = "POST", expect_100: bool = False
) -> RequestResponseCycle:
    scope = {"type": "http", "method": method, "path": "/", "http_version": "1.1", "headers": []}
    cycle = RequestResponseCycle(
        scope=scope,  # type: ignore[arg-type]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=expect_100,
        keep_alive=True,
        on_response=lambda: None,
    )
    cycle.transport = HeadWithBody(cycle, transport)  # type: ignore[arg-type, assignment]
    return cycle


def _start(length: int | None) -> Any:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def test_a_response_with_a_content_length_is_one_write_of_head_and_body() -> None:
    transport = _Transport()
    cycle = _cycle(transport)
    await cycle.send(_start(7))
    assert transport.calls == []  # the head waits for its body
    await cycle.send({"type": "http.response.body", "body": b'{"a":1}'})
    assert len(transport.calls) == 1
    head, _, body = transport.calls[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 7" in head
    assert body == b'{"a":1}' and cycle.response_complete


async def test_a_body_in_several_messages_goes_out_as_before_after_the_first() -> None:
    transport = _Transport()
    cycle = _cycle(transport)
    await cycle.send(_start(6))
    await cycle.send({"type": "http.response.body", "body": b"abc", "more_body": True})
    await cycle.send({"type": "http.response.body", "body": b"def"})
    assert [call.endswith(b"abc") for call in transport.calls] == [True, False]
    assert transport.calls[1] == b"def"


async def test_a_streamed_response_writes_its_head_at_once() -> None:
    transport = _Transport()
    cycle = _cycle(transport)
    await cycle.send(_start(None))  # chunked: its first chunk may come much later
    assert len(transport.calls) == 1 and b"transfer-encoding: chunked" in transport.calls[0]
    await cycle.send({"type": "http.response.body", "body": b"data", "more_body": True})
    assert transport.calls[1] == b"4\r\ndata\r\n"


async def test_a_head_request_and_an_interim_answer_are_not_held() -> None:
    transport = _Transport()
    cycle = _cycle(transport, method="HEAD", expect_100=True)
    cycle.body = bytearray(b"")
    cycle.more_body = False
    cycle.message_event.set()
    await cycle.receive()  # writes the 100 Continue before any response
    assert transport.calls == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    await cycle.send(_start(7))
    # A HEAD answer writes no body: its head must not wait for one.
    assert len(transport.calls) == 2 and transport.calls[1].endswith(b"content-length: 7\r\n\r\n")


async def test_closing_the_connection_sends_a_held_head_first() -> None:
    transport = _Transport()
    cycle = _cycle(transport)
    await cycle.send(_start(7))
    cycle.transport.close()  # what uvicorn does when the app fails after its head
    assert len(transport.calls) == 1 and transport.calls[0].startswith(b"HTTP/1.1 200")
    assert transport.closed


async def test_the_server_protocol_cancels_the_request_of_a_client_that_leaves() -> None:
    """The protocol's callback, not a watcher task, cancels the request's task."""
    started, cancelled = asyncio.Event(), asyncio.Event()
    watchers: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the whole body: from now on the connection is watched
        watchers.extend(
            t.get_coro().__qualname__  # type: ignore[union-attr]
            for t in asyncio.all_tasks()
            if "wait_for_disconnect" in t.get_coro().__qualname__  # type: ignore[union-attr]
        )
        started.set()
        try:
            await asyncio.Event().wait()  # an upstream that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    config = uvicorn.Config(
        DisconnectMiddleware(app),
        lifespan="off",
        log_level="warning",
        **uvicorn_options(ServerLimits.from_settings(GatewaySettings())),
    )
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
        await asyncio.wait_for(started.wait(), 10)
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 10)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        listener.close()
    assert watchers == []


@pytest.fixture(autouse=True)
def _quiet_uvicorn() -> None:
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
