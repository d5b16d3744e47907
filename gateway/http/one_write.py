"""A response with a ``Content-Length`` leaves in one write: its head waits for its body.

uvicorn writes a response's status line and headers when the app sends ``http.response.start``, and
the body when it sends ``http.response.body``. Two writes are two system calls and, with
``TCP_NODELAY`` (uvicorn sets it), two TCP segments: the client wakes for the head, parses it, and
wakes again for the body. An answer with a ``Content-Length`` (every answer of the inference path, of
the JSON routes and of the error renderer) sends its body right after its head, so the head is held
until then and both go out together (``writelines``: one ``writev`` on uvloop, the body not copied).

A streamed answer (chunked: no ``Content-Length``) is written as before, head first: its first
chunk may come much later, and the client should see the status meanwhile. Whatever closes the
connection (an app that failed after its head, the end of a ``Connection: close`` answer) flushes
the held head first, so the bytes on the wire are the same as before, in fewer writes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

__all__ = ["HeadWithBody"]


class HeadWithBody:
    """The transport one response's :class:`RequestResponseCycle` writes to (see the module).

    Args:
        cycle: the response's cycle: its state tells a head from a body.
        transport: the connection's transport.
    """

    __slots__ = ("_cycle", "_held", "_seen_head", "_transport")

    def __init__(self, cycle: RequestResponseCycle, transport: asyncio.Transport) -> None:
        self._cycle = cycle
        self._transport = transport
        self._held: bytes | None = None
        self._seen_head = False

    def write(self, data: bytes) -> None:
        # The cycle marks its response started just before writing the head; a 100 Continue
        # written earlier passes straight through.
        if not self._seen_head and self._cycle.response_started:
            self._seen_head = True
            # A Content-Length: the body follows at once (a HEAD answer has none to wait for).
            if self._cycle.chunked_encoding is False and self._cycle.scope["method"] != "HEAD":
                self._held = data
                return
        held = self._held
        if held is None:
            self._transport.write(data)
        else:
            self._held = None
            self._transport.writelines((held, data))

    def close(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        # Anything else the cycle might ask of a transport (extra info, buffer sizes) is the
        # connection's own.
        return getattr(self._transport, name)
