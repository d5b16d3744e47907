"""The middleware that holds each request's body bytes on its key's in-flight bound.

It sits inside authentication (the key and its tier are known) and outside decompression (the bytes
counted are the ones the client sent), in the list :func:`gateway.app.create_app` composes; the
accounting is :mod:`gateway.tenancy.inflight_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, Overloaded, PayloadTooLarge
from gateway.http.problems import ProblemRenderer
from gateway.tenancy.context import CONTEXT_KEY, RequestContext
from gateway.tenancy.inflight_bytes import InFlightBytes

__all__ = ["InFlightBytesMiddleware"]


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class InFlightBytesMiddleware:
    """Refuses a body that would take its key past its tier's ``max_inflight_bytes`` (429).

    A declared ``Content-Length`` is taken whole before the app runs (a refusal costs no read); a
    streamed body is taken chunk by chunk as the app reads it, and when a chunk does not fit the
    app's receive call raises and whatever the app then answers is replaced by the refusal. The
    bytes are given back just before the last part of the answer is sent (so a client that has its
    answer may send the next body at once), or when the request ends in any other way (an error,
    a disconnect, a cancellation).

    Args:
        app: the next ASGI app.
        ledger: the process's per-key ledger.
        bound: a tier's ``max_inflight_bytes`` (``None``: unbounded).
        renderer: the problem renderer.
        retry_after_s: the ``Retry-After`` of a 429.
    """

    app: ASGIApp
    ledger: InFlightBytes
    bound: Callable[[str], int | None]
    renderer: ProblemRenderer
    retry_after_s: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx: RequestContext | None = scope.get(CONTEXT_KEY) if scope["type"] == "http" else None
        principal = ctx.principal if ctx is not None else None
        bound = self.bound(principal.tier) if principal is not None else None
        if principal is None or bound is None:
            await self.app(scope, receive, send)
            return
        claim = self.ledger.claim(principal.client_id, principal.tier, bound, self.retry_after_s)
        declared = next(
            (v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"), b""
        )
        refused: GatewayError | None = None
        try:
            if declared.isdigit():
                claim.cover(int(declared))
        except (Overloaded, PayloadTooLarge) as exc:
            await self.renderer.answer(scope, send, exc)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                try:
                    claim.cover(received)
                except (Overloaded, PayloadTooLarge) as exc:
                    refused = exc
                    raise
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused is not None:
                return  # the app's own answer to the failed read is replaced by the refusal
            started = started or message["type"] == "http.response.start"
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                claim.release()
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except (Overloaded, PayloadTooLarge) as exc:
            if exc is not refused:
                raise
        finally:
            claim.release()
        if refused is not None and not started:
            await self.renderer.answer(scope, send, refused)
