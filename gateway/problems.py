"""One problem+json shape (RFC 9457) for every error the gateway answers.

Body: ``{"type", "title", "status", "detail", "instance"}`` plus ``"field"`` when one request field
is at fault. The status of each exception class comes from the single table the app factory passes
in (looked up along the class's MRO, so subclasses inherit their parent's status).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError

__all__ = ["PROBLEM_CONTENT_TYPE", "ProblemRenderer", "problem_document"]

PROBLEM_CONTENT_TYPE = "application/problem+json"


def _slug(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def problem_document(
    status: int,
    title: str,
    detail: str,
    instance: str,
    *,
    type_: str = "about:blank",
    field: str | None = None,
) -> dict[str, Any]:
    """The problem+json body as a dict (``field`` only when given)."""
    body: dict[str, Any] = {
        "type": type_,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if field is not None:
        body["field"] = field
    return body


class ProblemRenderer:
    """Renders :class:`GatewayError` instances with the app's status table.

    Args:
        table: exception class -> HTTP status.
    """

    def __init__(self, table: Mapping[type[GatewayError], int]) -> None:
        self.table = dict(table)

    def status_for(self, exc: GatewayError) -> int:
        for cls in type(exc).__mro__:
            if cls in self.table:
                return self.table[cls]  # type: ignore[index]
        return 500

    def render(self, exc: GatewayError, instance: str) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers, body)`` for ``exc`` raised while serving ``instance`` (the path)."""
        status = self.status_for(exc)
        body = problem_document(
            status,
            exc.title,
            exc.detail,
            instance,
            type_=f"urn:gateway:problem:{_slug(type(exc).__name__)}",
            field=exc.field,
        )
        headers = {"content-type": PROBLEM_CONTENT_TYPE, **exc.headers}
        return status, headers, json.dumps(body).encode()

    async def send(self, send: Any, exc: GatewayError, instance: str) -> None:
        """Answer an ASGI request with the problem for ``exc`` (used by middleware)."""
        status, headers, body = self.render(exc, instance)
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})
