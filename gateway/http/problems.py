"""Error bodies: one renderer, three shapes, chosen by the API a path belongs to.

Clients read errors the way their API defines them, and show nothing of a shape they do not know:

- ``problem`` (RFC 9457, ``application/problem+json``), the gateway's own routes:
  ``{"type", "title", "status", "detail", "instance"}`` plus ``"field"`` when one request field is at
  fault.
- ``openai`` on the OpenAI-compatible routes: ``{"error": {"message", "type", "param", "code"}}``,
  which the OpenAI SDKs turn into their exceptions and show the message of. OpenAI answers invalid
  parameters with 400, so a 422 (a field failed validation) is sent as 400 there.
- ``kserve`` on the KServe v2 routes: ``{"error": "<message>"}``, which tritonclient reads into its
  ``InferenceServerException``.

A client may ask for problem+json on any path with ``Accept: application/problem+json``.

The status of each exception class comes from the single table the app factory passes in (looked up
along the class's MRO, so subclasses inherit their parent's status); the shape does not change it
(except OpenAI's 422 -> 400). Headers (``Retry-After``, ``RateLimit-*``, ``WWW-Authenticate``) are the
same in every shape.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.errors import GatewayError

__all__ = [
    "INTERNAL_ERROR",
    "PROBLEM_CONTENT_TYPE",
    "ErrorReport",
    "ErrorShape",
    "ProblemRenderer",
    "openai_error_type",
    "problem_document",
    "raw_problem_response",
    "send_answer",
]

PROBLEM_CONTENT_TYPE = "application/problem+json"
JSON_CONTENT_TYPE = "application/json"


class ErrorShape(StrEnum):
    """Which API's error body a path answers with."""

    PROBLEM = "problem"
    OPENAI = "openai"
    KSERVE = "kserve"


def _slug(name: str, sep: str = "-") -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", sep, name).lower()


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


def raw_problem_response(
    status: int, title: str, detail: str, instance: str, headers: dict[str, str] | None = None
) -> bytes:
    """A whole HTTP/1.1 problem+json answer with ``Connection: close``, as bytes for a socket.

    For refusals made below the ASGI app (:mod:`gateway.http.limits`), where no framework renders.
    """
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


def openai_error_type(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


@dataclass(frozen=True)
class ErrorReport:
    """One error, before it takes a shape.

    Attributes:
        status: the HTTP status.
        title: short, fixed per kind of error (problem+json ``title``).
        detail: the explanation shown to the client.
        name: the error's kind in snake case (OpenAI ``code``; problem+json ``type`` as a URN slug).
        field: the request field at fault, when there is one.
        headers: extra response headers.
    """

    status: int
    title: str
    detail: str
    name: str
    field: str | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


#: what an unexpected exception answers: a 500, never relabelled as a client error
INTERNAL_ERROR = ErrorReport(
    500, "Internal server error", "the gateway failed; see its log", "internal_error"
)


async def send_answer(send: Any, status: int, headers: Mapping[str, str], body: bytes) -> None:
    """Answer an ASGI request whole: ``headers`` (any case; ``content-length`` added) and ``body``."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class ProblemRenderer:
    """Renders errors with the app's status table, in the shape of the API a path belongs to.

    Args:
        table: exception class -> HTTP status.
        shapes: ``(path prefix, shape)`` pairs; a path takes the shape of the first prefix it equals
            or continues with ``/``. Other paths get problem+json.
    """

    def __init__(
        self,
        table: Mapping[type[GatewayError], int],
        shapes: Sequence[tuple[str, ErrorShape]] = (),
    ) -> None:
        self.table = dict(table)
        self.shapes = tuple(shapes)

    def status_for(self, exc: GatewayError) -> int:
        for cls in type(exc).__mro__:
            if cls in self.table:
                return self.table[cls]  # type: ignore[index]
        return 500

    def shape_for(self, path: str, accept: str = "") -> ErrorShape:
        """The shape for ``path``, or problem+json when the client's ``accept`` header names it."""
        if PROBLEM_CONTENT_TYPE in accept.lower():
            return ErrorShape.PROBLEM
        for prefix, shape in self.shapes:
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return shape
        return ErrorShape.PROBLEM

    def report(self, exc: GatewayError) -> ErrorReport:
        """The status and facts of ``exc`` (its class's table entry, its detail, field and headers)."""
        return ErrorReport(
            status=self.status_for(exc),
            title=exc.title,
            detail=exc.detail,
            name=_slug(type(exc).__name__, "_"),
            field=exc.field,
            headers=exc.headers,
        )

    def render(
        self, exc: GatewayError, instance: str, accept: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers, body)`` for ``exc`` raised while serving ``instance`` (the path)."""
        return self.render_report(self.report(exc), instance, accept)

    def render_report(
        self, report: ErrorReport, instance: str, accept: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers, body)`` for ``report`` in the shape of ``instance``'s API."""
        shape = self.shape_for(instance, accept)
        status = report.status
        body: dict[str, Any]
        if shape is ErrorShape.OPENAI:
            status = 400 if status == 422 else status
            body = {
                "error": {
                    "message": report.detail,
                    "type": openai_error_type(status),
                    "param": report.field,
                    "code": report.name,
                }
            }
            content_type = JSON_CONTENT_TYPE
        elif shape is ErrorShape.KSERVE:
            body = {"error": report.detail}
            content_type = JSON_CONTENT_TYPE
        else:
            body = problem_document(
                status,
                report.title,
                report.detail,
                instance,
                type_=f"urn:gateway:problem:{report.name.replace('_', '-')}",
                field=report.field,
            )
            content_type = PROBLEM_CONTENT_TYPE
        headers = {"content-type": content_type, **report.headers}
        return status, headers, json.dumps(body).encode()

    async def answer(self, scope: Mapping[str, Any], send: Any, exc: GatewayError) -> None:
        """Answer the ASGI request of ``scope`` with the error for ``exc`` (used by middleware)."""
        await self.answer_report(scope, send, self.report(exc))

    async def answer_report(self, scope: Mapping[str, Any], send: Any, report: ErrorReport) -> None:
        """Answer the ASGI request of ``scope`` with ``report`` in its path's shape."""
        accept = next(
            (v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"accept"), ""
        )
        await send_answer(send, *self.render_report(report, scope.get("path", ""), accept))

    async def send(self, send: Any, exc: GatewayError, instance: str, accept: str = "") -> None:
        """Answer an ASGI request with the error for ``exc`` (middleware without a scope at hand)."""
        await send_answer(send, *self.render(exc, instance, accept))
