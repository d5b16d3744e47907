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
- 429 (Retry-After) a peer address opens connections faster than ``accept_rate_per_s`` (past a
  burst of ``accept_burst``): checked before any byte is parsed, answered when the address may
  connect again (:mod:`gateway.http.accept_rate` says how); never counted against the caps.
- 429 (Retry-After) more than ``max_connections`` connections are open, or more than
  ``max_connections_per_peer`` from the new connection's peer address, and none of them is idle:
  shed load the client should back off from, like the in-flight bound, not an outage. Where one
  is idle, the longest idle is closed instead and the new connection is served
  (:mod:`gateway.http.connection_caps`): pressure closes idle connections, it does not refuse requests.

Trailer fields of a chunked body are dropped: they never become request headers.

``keep_alive_timeout_s`` is uvicorn's idle keep-alive timeout (also after a request answered before
its body ended, which uvicorn alone would keep open); after ``max_requests_per_connection`` requests
a connection is answered with ``Connection: close``. A lost connection calls its requests'
disconnect callbacks (:class:`gateway.http.middleware.DisconnectMiddleware`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http.accept_rate import AcceptRate, HeldRefusals, RefusedConnection
from gateway.http.connection_caps import PeerCounts, idle_victim
from gateway.http.problems import raw_problem_response
from gateway.http.read_hold import PROTOCOL_SCOPE_KEY, ReadHold
from gateway.http.server_limits import ServerLimits

__all__ = ["LimitedHttpToolsProtocol", "uvicorn_options"]

#: how long a refused connection is kept to drain what the client is still sending
LINGER_S = 2.0


class _Refused(Exception):
    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus :class:`ServerLimits` (see the module docstring).

    Use :func:`uvicorn_options` (or :meth:`with_limits`) to get a subclass bound to limits; uvicorn
    builds one protocol object per connection from it.
    """

    limits: ClassVar[ServerLimits]
    peers: ClassVar[PeerCounts]  # connections per peer address, one table per bound class (server)
    accept_rate: ClassVar[AcceptRate]  # new connections per peer address, one table per server
    held_refusals: ClassVar[HeldRefusals]  # connections over the accept rate awaiting their answer
    # Orders when connections became idle. Not the loop's clock: uvloop's ticks in milliseconds, so
    # connections accepted in one tick would tie and the victim would be any of them.
    idle_clock: ClassVar[Iterator[int]]

    @classmethod
    def with_limits(cls, limits: ServerLimits) -> type[LimitedHttpToolsProtocol]:
        """A subclass bound to ``limits`` and its own peer table (uvicorn instantiates the class it
        is given)."""
        rate = AcceptRate(
            limits.accept_rate_per_s,
            limits.accept_burst,
            max_debt_s=limits.hold_ignored_retry_after_s,
        )
        return type(
            cls.__name__,
            (cls,),
            {
                "limits": limits,
                "peers": PeerCounts(),
                "accept_rate": rate,
                "held_refusals": HeldRefusals(rate, limits.max_connections, LINGER_S),
                "idle_clock": itertools.count(),
            },
        )

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
        # counted in ``peers`` from connection_made to connection_lost
        self._peer: str | None = None
        self._idle_from = 0
        self._hold = ReadHold()  # not read for a while after a key ignored Retry-After
        self._rate_refused: RefusedConnection | None = None  # over its address's accept rate
        self._on_lost: list[Callable[[], None]] = []
        self._lost = False

    # -- connection ------------------------------------------------------------------------------

    @property
    def peer(self) -> str:
        return self._peer or ""

    def idle_since(self) -> int | None:
        """When this connection last became idle (no request in progress, no byte of the next one),
        as a tick of the server's idle clock; None while it is not idle."""
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
        if self.accept_rate.enabled:
            peername = transport.get_extra_info("peername")
            address = peername[0] if isinstance(peername, tuple) else ""
            wait = self.accept_rate.admit(address)
            if wait > 0:
                # Nothing of uvicorn's connection is set up (no parser, no entry in the server's
                # connection set, no caps): only the answer and the end of the connection.
                self.transport = transport
                self._rate_refused = RefusedConnection(transport, address, wait, self.held_refusals)
                return
        super().connection_made(transport)
        self._idle_from = next(self.idle_clock)
        self._peer = self.client[0] if self.client else ""
        held = self.peers.add(self._peer)
        if held > self.limits.max_connections_per_peer and not self._close_idle(self._peer):
            self._refuse_crowded(
                f"this address already holds {self.limits.max_connections_per_peer} connections to the "
                "gateway and none is idle; retry shortly"
            )
            return
        if len(self.connections) > self.limits.max_connections and not self._close_idle(None):
            self._refuse_crowded(
                f"the gateway already holds {self.limits.max_connections} connections and none is idle; "
                "retry shortly"
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

    def eof_received(self) -> None:
        if self._rate_refused is not None:
            self._rate_refused.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._rate_refused is not None:
            self._rate_refused.lost()
            return  # never made into one of uvicorn's connections
        self._cancel_timers()
        if self._peer is not None:
            self.peers.remove(self._peer)
            self._peer = None
        super().connection_lost(exc)
        self._lost = True
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            callback()

    def watch_disconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the connection is lost (soon, if it is already), unless
        :meth:`unwatch_disconnect` came first: no task per request waiting on ``receive()``."""
        if self._lost:
            self.loop.call_soon(callback)
        else:
            self._on_lost.append(callback)

    def unwatch_disconnect(self, callback: Callable[[], None]) -> None:
        if callback in self._on_lost:  # not called yet
            self._on_lost.remove(callback)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_from = next(self.idle_clock)
        self._hold.after_response(self)

    def data_received(self, data: bytes) -> None:
        if self._discarding or self._rate_refused is not None:
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
        # The app's late answer asks whether the body still arrives (uvicorn types its scope closed).
        self.scope[PROTOCOL_SCOPE_KEY] = self  # type: ignore[literal-required]
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

    def _refuse_crowded(self, detail: str) -> None:
        """Refuse a connection over a connection bound (429): one may close within a second."""
        self._refuse(_Refused(429, "Too Many Requests", detail), {"retry-after": "1"})

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
                raw_problem_response(
                    refused.status, refused.title, refused.detail, instance, headers
                )
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
        self._hold.cancel()
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that apply ``limits``."""
    return {
        "http": LimitedHttpToolsProtocol.with_limits(limits),
        "timeout_keep_alive": limits.keep_alive_timeout_s,
    }
