"""The server protocol's disconnect callback (gateway.http.limits), through a real uvicorn server on
a loopback socket: a client that leaves cancels its request's task, and no watcher task is started
(the fakes of test_gateway_hot_path_units.py drive the watcher task other servers get)."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest
import uvicorn

from gateway.http.limits import uvicorn_options
from gateway.http.middleware import DisconnectMiddleware
from gateway.http.read_hold import PROTOCOL_SCOPE_KEY
from gateway.http.server_limits import ServerLimits
from gateway.settings import GatewaySettings


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


class _LostProtocol:
    """A server protocol whose connection is already lost: it calls a watcher soon, as
    LimitedHttpToolsProtocol.watch_disconnect does then."""

    def watch_disconnect(self, callback: Any) -> None:
        asyncio.get_running_loop().call_soon(callback)

    def unwatch_disconnect(self, callback: Any) -> None:
        pass


async def test_a_request_that_ended_is_not_cancelled_by_a_late_callback() -> None:
    """The client left while sending; the app gave up and returned before the callback ran."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.disconnect"

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        raise AssertionError("nobody to answer")

    scope = {"type": "http", "method": "POST", "path": "/x", PROTOCOL_SCOPE_KEY: _LostProtocol()}

    async def request() -> None:
        await DisconnectMiddleware(app)(scope, receive, send)
        await asyncio.sleep(0.05)  # the callback's turn comes while this task still runs

    task = asyncio.ensure_future(request())
    await asyncio.wait_for(task, 10)
    assert not task.cancelled() and task.cancelling() == 0
