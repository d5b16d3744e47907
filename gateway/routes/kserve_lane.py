"""The KServe v2 inference path as plain ASGI, inside the gateway's own middleware and around the
framework's routing: ``POST /v2/models/{name}/infer`` goes straight to the service.

Why: this path carries the inference traffic, and every framework layer it crossed cost CPU in the
event loop that serves every tenant: Starlette's exception middleware and handler wrappers,
FastAPI's exit-stack middleware, the router's route walk, a ``Request`` and a ``Response`` object
and their send wrappers. Under cProfile they were about a sixth of the request's CPU
(``inferctl bench gateway-profile``). The middleware that authenticates, limits and times the request
runs as before; only what lies between it and the handler goes.

It answers exactly as the framework route did (:func:`gateway.routes.kserve.infer` stays, for the
OpenAPI document and for ``/versions/{version}``): the same service call, the same KServe error body
through the same renderer, a 500 for an unexpected error. Other methods and paths go on to the
framework (a GET here still gets its 405).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError
from gateway.http.problems import INTERNAL_ERROR, ProblemRenderer, send_answer
from gateway.protocol.kserve import HEADER_LENGTH, RestBody
from gateway.tasks.service import InferenceService
from gateway.tenancy.context import CONTEXT_KEY, RequestContext

__all__ = ["InferLane"]

# The logger the framework's error handlers write to: operators filter on it.
log = logging.getLogger("gateway.app")

# Starlette's path converter for ``{name}``: one segment.
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)/infer")
_HEADER_LENGTH = HEADER_LENGTH.lower().encode("latin-1")


class InferLane:
    """ASGI middleware: the unversioned KServe inference path to the service, the rest onwards.

    Args:
        app: the next ASGI app (the framework).
        renderer: renders errors, as the framework's handlers do.
    """

    def __init__(self, app: ASGIApp, renderer: ProblemRenderer) -> None:
        self.app = app
        self.renderer = renderer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                await self._infer(scope, receive, send, match["name"])
                return
        await self.app(scope, receive, send)

    async def _infer(self, scope: Scope, receive: Receive, send: Send, model: str) -> None:
        try:
            body = await _read_body(receive)
            if body is None:
                return  # the client left while sending; nobody to answer
            headers = _wanted_headers(scope)
            service: InferenceService = scope["app"].state.service
            ctx: RequestContext = scope[CONTEXT_KEY]
            raw = await service.infer_v2(
                ctx,
                model,
                RestBody(body, headers.get(_HEADER_LENGTH)),
                accept_encoding=response_encoding(headers.get(b"accept-encoding", "")),
            )
        except GatewayError as exc:
            if self.renderer.status_for(exc) >= 500:
                log.warning("%s POST %s: %s", _request_id(scope), scope["path"], exc.detail)
            await self.renderer.answer(scope, send, exc)
            return
        except Exception:  # never relabelled as a client error: a 500, logged with the traceback
            log.exception("unhandled error on POST %s", scope["path"])
            await self.renderer.answer_report(scope, send, INTERNAL_ERROR)
            return
        await send_answer(send, 200, raw.headers, raw.body)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body, or ``None`` when the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_WANTED = frozenset((_HEADER_LENGTH, b"accept-encoding"))


def _wanted_headers(scope: Scope) -> dict[bytes, str]:
    """The few request headers this path reads (names lower-case)."""
    found: dict[bytes, str] = {}
    for key, value in scope["headers"]:
        name = key.lower()
        if name in _WANTED and name not in found:  # the first one, as Starlette's headers.get
            found[name] = value.decode("latin-1")
    return found


def _request_id(scope: Scope) -> Any:
    ctx = scope.get(CONTEXT_KEY)
    return ctx.request_id if ctx is not None else "-"


def response_encoding(accept: str) -> str:
    """The coding Triton may use for its answer: one the client accepts and Triton can produce."""
    offered = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return next((coding for coding in ("gzip", "deflate") if coding in offered), "identity")
