"""The app factory: ``create_app(settings) -> FastAPI``.

Owns the wiring and nothing else: the one table from exceptions to HTTP statuses, the middleware
list, the routers, and a lifespan that opens (and closes) the Triton client pool, the rate limiter
and the Triton statistics poller. Nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware

from gateway import errors
from gateway.auth import Authenticator
from gateway.keys import KeyStore
from gateway.middleware import AuthMiddleware, BodyLimitMiddleware, ContextMiddleware
from gateway.problems import PROBLEM_CONTENT_TYPE, ProblemRenderer, problem_document
from gateway.ratelimit import InProcessRateLimiter, RateLimiter, RedisRateLimiter
from gateway.routes import admin, classify, health, kserve, openai, stats
from gateway.routes import traffic as traffic_routes
from gateway.routes._deps import ADMIN_AUTH, CLIENT_AUTH, SECURITY_SCHEMES
from gateway.service import InferenceService
from gateway.settings import GatewaySettings
from gateway.stats import LatencyTracker
from gateway.traffic import TrafficSplit
from gateway.triton import InferenceBackend, TritonHttpBackend

__all__ = ["ERROR_STATUS", "create_app"]

log = logging.getLogger(__name__)

# The one table: exception class -> HTTP status. Subclasses inherit their parent's entry.
ERROR_STATUS: dict[type[errors.GatewayError], int] = {
    errors.BadRequest: 400,
    errors.AuthenticationError: 401,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.PayloadTooLarge: 413,
    errors.RateLimited: 429,
    errors.Overloaded: 429,
    errors.UpstreamError: 502,
    errors.ServiceUnavailable: 503,
    errors.UpstreamTimeout: 504,
}

PUBLIC_PATHS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/v2/health/live",
    "/v2/health/ready",
    "/docs",
    "/redoc",
    "/openapi.json",
)
PUBLIC_PREFIXES = ("/docs/",)

_DESCRIPTION = """\
Authenticated, rate-limited access to the models Triton serves.

**Credentials**: `Authorization: Bearer <api key | JWT>` or `X-API-Key: <api key>`; the admin API takes
`X-Admin-Token` (or `Authorization: Bearer <admin token>`).

**Errors** are `application/problem+json` (RFC 9457): `type`, `title`, `status`, `detail`, `instance`, and
`field` when one request field is at fault. 429 and 503 carry `Retry-After`; inference responses carry
`RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and `RateLimit-Policy`.
"""


def _build_limiter(settings: GatewaySettings) -> RateLimiter:
    url = settings.redis_url.get_secret_value()
    if not url:
        return InProcessRateLimiter()
    return RedisRateLimiter(
        url,
        failure_policy=settings.redis_failure_policy,
        timeout_s=settings.redis_timeout_s,
        retry_after_s=settings.redis_retry_after_s,
    )


async def _poll_triton_stats(backend: InferenceBackend, tracker: LatencyTracker, interval_s: float) -> None:
    """Feed Triton's cumulative per-model statistics into the tracker, forever (cancelled at shutdown)."""
    while True:
        try:
            for model in await backend.statistics(timeout_s=max(1.0, interval_s)):
                inference = model.get("inference_stats", {})
                tracker.update_triton(
                    model["name"],
                    requests=int(inference.get("success", {}).get("count", 0)),
                    queue_ns=int(inference.get("queue", {}).get("ns", 0)),
                    compute_ns=int(inference.get("compute_infer", {}).get("ns", 0)),
                    success_ns=int(inference.get("success", {}).get("ns", 0)),
                )
        except errors.GatewayError as exc:  # Triton down or slow: try again next tick
            log.debug("Triton statistics poll failed: %s", exc.detail)
        await asyncio.sleep(interval_s)


def _validation_problem(request: Request, exc: RequestValidationError) -> Response:
    first: dict[str, Any] = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "header")]
    field = ".".join(loc) or "body"
    if first.get("type") == "json_invalid":
        status, title, detail, field = (
            400,
            "Bad request",
            f"body is not valid JSON: {first.get('ctx', {}).get('error', '')}",
            "body",
        )
        slug = "bad-request"
    else:
        status, title, slug = 422, "Validation error", "validation-error"
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:5]
        )
    body = problem_document(
        status, title, detail, request.url.path, type_=f"urn:gateway:problem:{slug}", field=field
    )
    return Response(json.dumps(body), status_code=status, media_type=PROBLEM_CONTENT_TYPE)


def create_app(
    settings: GatewaySettings,
    *,
    backend_factory: Callable[[GatewaySettings], InferenceBackend] | None = None,
    limiter_factory: Callable[[GatewaySettings], RateLimiter] | None = None,
) -> FastAPI:
    """Build the gateway.

    Args:
        settings: configuration.
        backend_factory: makes the inference backend at startup (default: Triton over HTTP);
            unit tests pass a fake.
        limiter_factory: makes the rate limiter at startup (default: Redis if configured, else in process).

    Returns:
        The ASGI app; its lifespan opens and closes the Triton pool and the limiter.
    """
    renderer = ProblemRenderer(ERROR_STATUS)
    tracker = LatencyTracker(settings.stats_window_s, settings.stats_max_samples, settings.max_client_labels)
    store = KeyStore(settings.keys_db)
    traffic = TrafficSplit()
    authenticator = Authenticator(settings, store)
    make_backend = backend_factory or (lambda s: TritonHttpBackend(s.triton_http_url, s.triton_pool_size))
    make_limiter = limiter_factory or _build_limiter

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        backend = make_backend(settings)
        limiter = make_limiter(settings)
        app.state.backend = backend
        app.state.limiter = limiter
        app.state.service = InferenceService(settings, backend, limiter, tracker, traffic)
        poller = None
        if settings.triton_stats_interval_s > 0:
            poller = asyncio.create_task(
                _poll_triton_stats(backend, tracker, settings.triton_stats_interval_s)
            )
        try:
            yield
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            await backend.close()
            await limiter.close()

    # Outermost first. Context wraps everything so even 401/413 answers get a request id and log line.
    middleware = [
        Middleware(ContextMiddleware, tracker=tracker),
        Middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, renderer=renderer),
        Middleware(
            AuthMiddleware,
            authenticator=authenticator,
            renderer=renderer,
            public=PUBLIC_PATHS,
            public_prefixes=PUBLIC_PREFIXES,
        ),
    ]
    app = FastAPI(
        title="Inference gateway",
        version="0.1.0",
        description=_DESCRIPTION,
        lifespan=lifespan,
        middleware=middleware,
    )
    app.state.settings = settings
    app.state.tracker = tracker
    app.state.key_store = store
    app.state.traffic = traffic
    app.state.authenticator = authenticator
    app.state.renderer = renderer

    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GatewayError)
        status, headers, body = renderer.render(exc, request.url.path)
        if status >= 500:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc.detail)
        return Response(body, status_code=status, headers=headers)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.__cause__, errors.GatewayError):  # e.g. a body read that hit our limit
            return await gateway_error(request, exc.__cause__)
        body = problem_document(exc.status_code, "HTTP error", str(exc.detail), request.url.path)
        return Response(
            json.dumps(body),
            status_code=exc.status_code,
            media_type=PROBLEM_CONTENT_TYPE,
            headers=exc.headers,
        )

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _validation_problem(request, exc)

    async def unexpected(request: Request, exc: Exception) -> Response:
        # Never relabelled as a client error: a 500, logged with the traceback.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = problem_document(
            500, "Internal server error", "the gateway failed; see its log", request.url.path
        )
        return Response(json.dumps(body), status_code=500, media_type=PROBLEM_CONTENT_TYPE)

    app.add_exception_handler(errors.GatewayError, gateway_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)

    # Inference routes first: Starlette matches routes in order, and these carry the traffic.
    for module in (kserve, openai, classify, health, stats, admin, traffic_routes):
        app.include_router(module.router)
    _document_security(app)
    return app


def _document_security(app: FastAPI) -> None:
    """Declare in OpenAPI which credential each route takes (the auth middleware enforces it)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
            for path, operations in schema.get("paths", {}).items():
                if path in PUBLIC_PATHS:
                    continue
                requirement = ADMIN_AUTH if path.startswith("/admin/") else CLIENT_AUTH
                for operation in operations.values():
                    operation.update(requirement)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
