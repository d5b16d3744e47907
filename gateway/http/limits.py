"""Connection-level limits uvicorn's httptools protocol lacks: header size and count, header and
body read deadlines, a connection cap and a request cap per keep-alive connection.

httptools buffers a header until its end, however long, and uvicorn sets no deadline on a request
that is half sent: a 64 MB header was once read in full before the 401, and a client sending one
byte every few seconds held its connection forever. :class:`LimitedHttpToolsProtocol` counts the
bytes of each request head as they arrive and answers before buffering more than
``max_header_bytes`` (plus one socket read), and arms a deadline for the head and one for the body.

Refusals are problem+json answers written straight to the socket, then the connection is closed
after a short linger (bytes still arriving are read and dropped, so the client can read the answer
instead of a connection reset):

- 431 a request head over ``max_header_bytes`` or with more than ``max_header_count`` fields
- 408 the head did not arrive within ``header_timeout_s``, or the body within ``body_timeout_s``
  (a body deadline that passes after the answer was sent just closes the connection)
- 429 (Retry-After) more than ``max_connections`` connections are open, or more than
  ``max_connections_per_peer`` from the new connection's peer address, and none of them is idle:
  shed load the client should back off from, like the in-flight bound, not an outage. Where one
  is idle, the longest idle is closed instead and the new connection is served
  (:mod:`gateway.http.connection_caps`): pressure closes idle connections, it does not refuse requests.

Trailer fields of a chunked body are dropped: they never become request headers.

``keep_alive_timeout_s`` is uvicorn's idle keep-alive timeout (also after a request answered before
its body ended, which uvicorn alone would keep open); after ``max_requests_per_connection`` requests
a connection is answered with ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http.connection_caps import PeerCounts, idle_victim
from gateway.http.problems import PROBLEM_CONTENT_TYPE, problem_document
from gateway.settings import GatewaySettings

__all__ = ["LimitedHttpToolsProtocol", "ServerLimits", "uvicorn_options"]

#: how long a refused connection is kept to drain what the client is still sending
LINGER_S = 2.0


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """Per-connection limits (the ``GatewaySettings`` fields of the same names).

    Args:
        max_header_bytes: bytes of a request line plus headers.
        max_header_count: header fields per request.
        header_timeout_s: seconds from a request's first byte (or the connection's start) to the
            end of its headers.
        body_timeout_s: seconds from the end of the headers to the last byte of the body.
        max_connections: open connections; past it an idle one is closed, or the new one is
            answered 429 with Retry-After.
        max_connections_per_peer: open connections from one peer address; the same past it.
        keep_alive_timeout_s: seconds an idle keep-alive connection stays open.
        max_requests_per_connection: requests served on one connection before it is closed.
    """

    max_header_bytes: int
    max_header_count: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_peer: int
    keep_alive_timeout_s: float
    max_requests_per_connection: int

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ServerLimits:
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            max_connections=settings.max_connections,
            max_connections_per_peer=settings.max_connections_per_peer,
            keep_alive_timeout_s=settings.keep_alive_timeout_s,
            max_requests_per_connection=settings.max_requests_per_connection,
        )


class _Refused(Exception):
    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


def _answer(
    status: int, title: str, detail: str, instance: str, headers: dict[str, str] | None = None
) -> bytes:
    slug = title.lower().replace(" ", "-")
    body = json.dumps(
        problem_document(status, title, detail, instance, type_=f"urn:gateway:problem:{slug}")
    ).encode()
    lines = [
        f"HTTP/1.1 {status} {title}",
        f"content-type: {PROBLEM_CONTENT_TYPE}",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus :class:`ServerLimits` (see the module docstring).

    Use :func:`uvicorn_options` (or :meth:`with_limits`) to get a subclass bound to limits; uvicorn
    builds one protocol object per connection from it.
    """

    limits: ClassVar[ServerLimits]
    peers: ClassVar[PeerCounts]  # connections per peer address, one table per bound class (server)

    @classmethod
    def with_limits(cls, limits: ServerLimits) -> type[LimitedHttpToolsProtocol]:
        """A subclass bound to ``limits`` and its own peer table (uvicorn instantiates the class it is given)."""
        return type(cls.__name__, (cls,), {"limits": limits, "peers": PeerCounts()})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # reading a request line and headers (not a body, not idle)
        self._head_bytes = 0
        self._head_tail = b""  # the last bytes of the head so far, to find its end across reads
        self._header_count = 0
        self._requests = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._discarding = False
        self._peer: str | None = (
            None  # counted in ``peers`` from connection_made to connection_lost
        )
        self._idle_from = 0.0

    # -- connection ------------------------------------------------------------------------------

    @property
    def peer(self) -> str:
        return self._peer or ""

    def idle_since(self) -> float | None:
        """When this connection last became idle (no request in progress, no byte of the next one), or None."""
        cycle = self.cycle
        idle = (
            self._in_head
            and self._head_bytes == 0
            and not self._discarding
            and not self.pipeline
            and (cycle is None or cycle.response_complete)
            and not self.transport.is_closing()
        )
        return self._idle_from if idle else None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_from = self.loop.time()
        self._peer = self.client[0] if self.client else ""
        held = self.peers.add(self._peer)
        if held > self.limits.max_connections_per_peer and not self._close_idle(self._peer):
            self._refuse(
                _Refused(
                    429,
                    "Too Many Requests",
                    f"this address already holds {self.limits.max_connections_per_peer} connections to the "
                    "gateway and none is idle; retry shortly",
                ),
                {"retry-after": "1"},
            )
            return
        if len(self.connections) > self.limits.max_connections and not self._close_idle(None):
            self._refuse(
                _Refused(
                    429,
                    "Too Many Requests",
                    f"the gateway already holds {self.limits.max_connections} connections and none is idle; "
                    "retry shortly",
                ),
                {"retry-after": "1"},
            )
            return
        self._arm_head_timer()  # a connection that never sends a byte is a slow head too

    def _close_idle(self, peer: str | None) -> bool:
        """Close the longest idle connection (of ``peer``, else of the peer holding the most) to make
        room for this one; False when none is idle."""
        mine = (c for c in self.connections if isinstance(c, LimitedHttpToolsProtocol))
        victim = idle_victim(mine, self.peers, peer=peer, exclude=self)
        if victim is None:
            return False
        self.logger.info(
            "closed an idle connection from %s to make room (%s)",
            victim.client,
            "its address is at its cap" if peer is not None else "the gateway is at its cap",
        )
        victim._cancel_timers()
        victim.transport.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._peer is not None:
            self.peers.remove(self._peer)
            self._peer = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_from = self.loop.time()

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if self._in_head:
            # Counted before the parser sees the bytes, so a head over the limit is never buffered.
            self._head_bytes += self._head_part(data)
            self._arm_head_timer()
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(self._head_too_large())
                return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # our callbacks raise _Refused through it
            if isinstance(exc.__context__, _Refused):
                self._refuse(exc.__context__)
                return
            self._refuse(_Refused(400, "Bad Request", "invalid HTTP request"))
            return
        except httptools.HttpParserError:
            self._refuse(_Refused(400, "Bad Request", "invalid HTTP request"))
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return

    def _head_part(self, data: bytes) -> int:
        """How many bytes of ``data`` belong to the request head (up to its blank line).

        A read that ends one request and starts the next is counted from the next read on, and
        blank lines before a request line end the count early: either way at most one read less.
        """
        across = (self._head_tail + data[:3]).find(b"\r\n\r\n")
        if across >= 0:
            return across + 4 - len(self._head_tail)
        end = data.find(b"\r\n\r\n")
        self._head_tail = (self._head_tail + data)[-3:] if len(data) < 3 else data[-3:]
        return len(data) if end < 0 else end + 4

    # -- parser callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._header_count = 0
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            # A chunked body's trailer fields: uvicorn appends them to the list it already handed
            # the app as ``scope["headers"]``, so an ``Authorization`` or ``Content-Encoding`` sent
            # after the body would be read as a header by whatever looks later. Trailers are dropped.
            return
        self._header_count += 1
        if self._header_count > self.limits.max_header_count:
            raise _Refused(
                431,
                "Request Header Fields Too Large",
                f"the request has more than {self.limits.max_header_count} header fields",
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel(self._head_timer)
        self._head_timer = None
        super().on_headers_complete()
        self._requests += 1
        if self._requests >= self.limits.max_requests_per_connection and self.cycle is not None:
            self.cycle.keep_alive = False
        self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel(self._body_timer)
        self._body_timer = None
        self._in_head, self._head_bytes, self._head_tail = True, 0, b""
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not self.pipeline:
            # Answered before the body ended (a 401 or 413): uvicorn armed its keep-alive timer then,
            # and the rest of the body cancelled it. Arm it again, or the connection stays open forever.
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    # -- refusals --------------------------------------------------------------------------------

    def _head_too_large(self) -> _Refused:
        return _Refused(
            431,
            "Request Header Fields Too Large",
            f"the request line and headers are larger than {self.limits.max_header_bytes} bytes",
        )

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._head_timed_out
            )

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(
                _Refused(
                    408,
                    "Request Timeout",
                    f"the request line and headers did not arrive within {self.limits.header_timeout_s:g} s",
                )
            )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if cycle.response_started:
            self.transport.close()  # answered already; the rest of the body is not worth waiting for
            return
        self._refuse(
            _Refused(
                408,
                "Request Timeout",
                f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
            )
        )

    def _refuse(self, refused: _Refused, headers: dict[str, str] | None = None) -> None:
        """Answer ``refused`` unless an answer is under way, stop the app, drain briefly, close."""
        self._cancel_timers()
        self._discarding = True
        cycle = (
            None if self._in_head else self.cycle
        )  # while reading a head, no app runs for it yet
        answered = cycle is not None and cycle.response_started
        if cycle is not None:  # the app's receive() returns http.disconnect; its sends are dropped
            cycle.disconnected = True
            cycle.message_event.set()
        if self.transport.is_closing():
            return
        self.logger.info("refused a connection from %s: %s", self.client, refused.detail)
        if not answered:
            instance = cycle.scope.get("path", "") if cycle is not None else ""
            self.transport.write(
                _answer(refused.status, refused.title, refused.detail, instance, headers)
            )
        self.flow.resume_reading()
        self.loop.call_later(LINGER_S, self._close)

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that apply ``limits``."""
    return {
        "http": LimitedHttpToolsProtocol.with_limits(limits),
        "timeout_keep_alive": limits.keep_alive_timeout_s,
    }
