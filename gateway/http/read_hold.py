"""Not reading a connection for a while: what a key that ignores ``Retry-After`` gets.

A client told 429 with ``Retry-After`` that sends again at once on the same keep-alive connection
makes the gateway parse, authenticate and refuse request after request (0.2 ms of CPU each on the
isolation benchmark's machine): a closed loop that runs as fast as the gateway answers, on the event
loop every other tenant shares. The accept rate (:mod:`gateway.http.accept_rate`) never sees it, since
no connection is opened.

So when a key sends a request before the ``Retry-After`` it was given has passed, the app marks the
answer (:data:`HOLD_SCOPE_KEY` in the request's scope, the seconds left of that ``Retry-After``, at
most ``hold_ignored_retry_after_s``), and the connection's protocol stops reading from the socket
once the answer is written, until then. The client's next request waits in its socket buffer at no
cost to the gateway and is answered when the hold ends (the keep-alive timer waits for the hold). A
client that honours ``Retry-After`` sends nothing meanwhile and never notices.

Not while the refused request's body is still arriving: a client sending a 15 MiB body that gets its
429 early gives up that connection and opens another, and a connection left unread keeps the
megabytes already sent in the kernel's buffers for the whole hold, its client gone unnoticed (the
protocol reads nothing, so it sees no end either). So there the hold comes before the answer
instead (:func:`answer_late`): the app waits before its 429, uvicorn stops reading once 64 KiB of
the body are buffered, the client waits for its answer instead of sending again, and the connection
is closed after the answer (``Connection: close``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["HOLD_SCOPE_KEY", "PROTOCOL_SCOPE_KEY", "ReadHold", "answer_late", "mark_hold"]

#: the scope key the app sets (seconds) on a request whose connection is not to be read for a while
HOLD_SCOPE_KEY = "gateway.hold_reading_s"
#: the scope key under which the connection's protocol puts itself (whether the body is still arriving)
PROTOCOL_SCOPE_KEY = "gateway.protocol"


def mark_hold(
    scope: MutableMapping[str, Any],
    client_id: str,
    headers: list[tuple[bytes, bytes]],
    note: Callable[[str, float], float],
) -> None:
    """For a 429 answer to ``client_id`` with these ``headers``: ``note(client_id, retry_after_s)``
    says how long to hold the connection (:class:`gateway.tenancy.refusals.RetryAfterWatch`); a hold
    is marked in ``scope`` for the protocol."""
    value = next((v for k, v in headers if k.lower() == b"retry-after"), None)
    try:
        wait_s = float(value) if value is not None else 0.0
    except ValueError:  # an HTTP date: ours are seconds
        return
    hold_s = note(client_id, wait_s)
    if hold_s > 0:
        scope[HOLD_SCOPE_KEY] = hold_s


def answer_late(scope: MutableMapping[str, Any], headers: list[tuple[bytes, bytes]]) -> float:
    """For a held answer (:func:`mark_hold`) whose request body is still arriving: the seconds to
    wait before sending it; the hold is moved there from after the answer, and ``headers`` get
    ``Connection: close``. 0.0 otherwise."""
    hold_s = scope.get(HOLD_SCOPE_KEY)
    protocol = scope.get(PROTOCOL_SCOPE_KEY)
    cycle = getattr(protocol, "cycle", None)
    if not hold_s or cycle is None or cycle.scope is not scope or not cycle.more_body:
        return 0.0
    del scope[HOLD_SCOPE_KEY]
    headers.append((b"connection", b"close"))
    return float(hold_s)


class ReadHold:
    """One connection's hold (see the module docstring); the protocol calls it after each answer."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None

    def after_response(self, protocol: Any) -> None:
        """Pause reading ``protocol``'s connection for the seconds its finished request's scope
        names, if any (``protocol``: uvicorn's httptools protocol, just after its answer)."""
        scope = getattr(protocol, "scope", None)
        seconds = scope.get(HOLD_SCOPE_KEY) if scope else None
        transport = protocol.transport
        if not seconds or transport.is_closing():
            return
        self.cancel()
        # uvicorn's keep-alive timer would close the connection while the client's next request
        # waits unread: the client gets its answer late instead, and the timer starts again after.
        if protocol.timeout_keep_alive_task is not None:
            protocol.timeout_keep_alive_task.cancel()
            protocol.timeout_keep_alive_task = None
        protocol.flow.pause_reading()

        def release() -> None:
            self._timer = None
            if transport.is_closing():
                return
            protocol.flow.resume_reading()  # a waiting request is read now and cancels the timer
            protocol.timeout_keep_alive_task = protocol.loop.call_later(
                protocol.timeout_keep_alive, protocol.timeout_keep_alive_handler
            )

        self._timer = protocol.loop.call_later(seconds, release)

    @property
    def holding(self) -> bool:
        return self._timer is not None

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
