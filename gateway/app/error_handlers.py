"""How every error answers: the one table from exceptions to HTTP statuses, which API's error body
each path answers with, and the exception handlers that render them through one
:class:`~gateway.http.problems.ProblemRenderer` (:mod:`gateway.http.validation_report` words
validation failures)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway import errors
from gateway.http.problems import INTERNAL_ERROR, ErrorReport, ErrorShape, ProblemRenderer
from gateway.http.validation_report import validation_report
from gateway.tenancy.context import CONTEXT_KEY

__all__ = ["ERROR_SHAPES", "ERROR_STATUS", "install_error_handlers"]

log = logging.getLogger("gateway.app")

# The one table: exception class -> HTTP status. Subclasses inherit their parent's entry.
ERROR_STATUS: dict[type[errors.GatewayError], int] = {
    errors.BadRequest: 400,
    errors.AuthenticationError: 401,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.Gone: 410,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.RateLimited: 429,
    errors.Overloaded: 429,
    errors.UpstreamError: 502,
    errors.ServiceUnavailable: 503,
    errors.UpstreamTimeout: 504,
    errors.ModelTooLarge: 507,
}

# Which API's error body each path answers with (problem+json elsewhere): the OpenAI SDKs show only
# ``{"error": {"message", ...}}`` bodies, tritonclient only ``{"error": "..."}`` ones.
ERROR_SHAPES: tuple[tuple[str, ErrorShape], ...] = (
    ("/v2", ErrorShape.KSERVE),
    ("/v1/models", ErrorShape.OPENAI),
    ("/v1/embeddings", ErrorShape.OPENAI),
    # Signed image URLs are fetched by browsers and image loaders, not the SDKs: problem+json.
    ("/v1/images/files", ErrorShape.PROBLEM),
    ("/v1/images", ErrorShape.OPENAI),
)


def install_error_handlers(app: FastAPI, renderer: ProblemRenderer) -> None:
    """Every error answers in the shape of its path's API, through the one renderer."""

    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GatewayError)
        status, headers, body = renderer.render(
            exc, request.url.path, request.headers.get("accept", "")
        )
        if status >= 500:
            ctx = request.scope.get(CONTEXT_KEY)
            log.warning(
                "%s %s %s -> %d: %s",
                ctx.request_id if ctx is not None else "-",
                request.method,
                request.url.path,
                status,
                exc.detail,
            )
        return Response(body, status_code=status, headers=headers)

    def answer(request: Request, report: ErrorReport) -> Response:
        status, headers, body = renderer.render_report(
            report, request.url.path, request.headers.get("accept", "")
        )
        return Response(body, status_code=status, headers=headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.__cause__, errors.GatewayError):  # e.g. a body read that hit our limit
            return await gateway_error(request, exc.__cause__)
        name = "not_found" if exc.status_code == 404 else "http_error"
        return answer(
            request,
            ErrorReport(
                exc.status_code,
                "HTTP error",
                str(exc.detail),
                name,
                headers=dict(exc.headers or {}),
            ),
        )

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return answer(request, validation_report(exc))

    async def unexpected(request: Request, exc: Exception) -> Response:
        # Never relabelled as a client error: a 500, logged with the traceback.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return answer(request, INTERNAL_ERROR)

    app.add_exception_handler(errors.GatewayError, gateway_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
