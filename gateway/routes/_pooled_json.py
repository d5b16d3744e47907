"""FastAPI routes whose big JSON bodies are decoded in the app's parse processes, not on the loop.

FastAPI decodes a JSON body with ``json.loads`` on the event loop: C code that holds the GIL for
the whole document (tens of milliseconds for a few MiB on the CI machine), and every tenant's
requests wait meanwhile. :class:`PooledJsonRoute` decodes a body of ``parse_process_min_bytes`` or
more in the app's :class:`gateway.protocol.kserve.ParsePool` (the processes that parse big KServe
bodies) and hands FastAPI the decoded document, which it then validates as usual: the OpenAPI
document, the validation and its errors stay FastAPI's own. A body FastAPI would not decode (not a
JSON media type) and small ones are left to FastAPI.

A body that is not JSON is refused as FastAPI refuses it (the same ``json_invalid`` validation
error, or 400 for one that is not text), without a second decode on the loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from gateway.protocol.kserve import ParsePool

__all__ = ["PooledJsonRoute"]


def _json_media_type(content_type: str | None) -> bool:
    """Whether FastAPI decodes a body of this ``Content-Type`` as JSON (application/json, */*+json)."""
    if not content_type:
        return False  # FastAPI's strict content type: such a body is not decoded at all
    media = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = media.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


class PooledJsonRoute(APIRoute):
    """An ``APIRoute`` whose JSON body, when big, is decoded in ``app.state.parse_pool``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler  # no body to decode (a GET)

        async def pooled(request: Request) -> Response:
            pool = request.app.state.parse_pool
            if pool is not None and _json_media_type(request.headers.get("content-type")):
                body = await request.body()  # kept on the request: FastAPI's handler reuses it
                if len(body) >= request.app.state.settings.parse_process_min_bytes:
                    # Starlette's Request.json() returns ``_json`` when set: FastAPI's handler
                    # then validates this document instead of decoding the body again.
                    request._json = await _decode(pool, body)
            return await handler(request)

        return pooled


async def _decode(pool: ParsePool, body: bytes) -> Any:
    try:
        return await pool.run(json.loads, body)
    except json.JSONDecodeError as exc:
        # What FastAPI raises for the same body (gateway.http.validation_report renders it).
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", exc.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.msg},
                }
            ]
        ) from exc
    except (ValueError, RecursionError) as exc:  # not text in a JSON encoding, or nested too deep
        raise HTTPException(400, "There was an error parsing the body") from exc
