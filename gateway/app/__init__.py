"""The app factory: ``create_app(settings) -> FastAPI``.

Owns the wiring and nothing else: which paths are public, the middleware list and the routers, here;
the parts built before the app starts in :mod:`gateway.app.parts`; the one table from exceptions to
HTTP statuses and the handlers that use it in :mod:`gateway.app.error_handlers`; what starts and
stops with the app (the Triton client pool, the rate limiter, the statistics poller, the shared-state
sync, the job store and its workers, the KServe v2 gRPC entry) in :mod:`gateway.app.lifespan`; what
backs each store in :mod:`gateway.app.stores`. :mod:`gateway.routes.openapi_doc` finishes the OpenAPI
document. Nothing happens at import time.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fastapi import FastAPI
from starlette.middleware import Middleware

from gateway.app.error_handlers import ERROR_SHAPES, ERROR_STATUS, install_error_handlers
from gateway.app.lifespan import make_lifespan
from gateway.app.parts import AppParts, build_parts
from gateway.app.stores import build_backend, build_image_store, build_limiter
from gateway.backends.triton import InferenceBackend
from gateway.http.body_bytes import InFlightBytesMiddleware
from gateway.http.compression import DecompressionMiddleware
from gateway.http.middleware import (
    AuthMiddleware,
    BodyLimitMiddleware,
    ContextMiddleware,
    DisconnectMiddleware,
)
from gateway.jobs.image_urls import ImageUrlSigner
from gateway.routes import (
    admin,
    classify,
    health,
    jobs,
    kserve,
    openai,
    residency_admin,
    stats,
    usage,
)
from gateway.routes import traffic as traffic_routes
from gateway.routes.kserve_lane import InferLane
from gateway.routes.openapi_doc import document_security
from gateway.settings import GatewaySettings
from gateway.tenancy.auth import AuthRoutes
from gateway.tenancy.inflight_bytes import InFlightBytes
from gateway.tenancy.ratelimit import RateLimiter
from gateway.tenancy.refusals import RefusalCharge, RetryAfterWatch

__all__ = [
    "AUTH_ROUTES",
    "ERROR_SHAPES",
    "ERROR_STATUS",
    "METRICS_PATHS",
    "PUBLIC_PATHS",
    "PUBLIC_PREFIXES",
    "SIGNED_PATHS",
    "create_app",
]

PUBLIC_PATHS = (
    "/healthz",
    "/readyz",
    "/v2/health/live",
    "/v2/health/ready",
    "/docs",
    "/redoc",
    "/openapi.json",
)
# Signed image URLs carry their own credential (an HMAC and an expiry, checked by the route).
PUBLIC_PREFIXES = ("/docs/", "/v1/images/files/")
# A job's image URLs open with their signature alone too (the route checks it; with a key, the owner's).
SIGNED_PATHS = re.compile(r"/v1/images/jobs/[^/]+/images/[0-9]+")
# Metrics name every model and client: behind GATEWAY_METRICS_TOKEN (or the admin token).
METRICS_PATHS = ("/metrics",)
# The classes above as the auth middleware takes them (the admin API keeps its default prefix).
AUTH_ROUTES = AuthRoutes(
    public=frozenset(PUBLIC_PATHS),
    public_prefixes=PUBLIC_PREFIXES,
    metrics_paths=frozenset(METRICS_PATHS),
    signed_paths=SIGNED_PATHS,
)

_DESCRIPTION = """\
Authenticated, rate-limited access to the models Triton serves.

**Credentials**: `Authorization: Bearer <api key | JWT>` or `X-API-Key: <api key>`; the admin API takes
`X-Admin-Token` (or `Authorization: Bearer <admin token>`); `/metrics` takes
`Authorization: Bearer <metrics token>` (`GATEWAY_METRICS_TOKEN`, or the admin token).

**Errors** take the shape of the API a route belongs to: OpenAI's `{"error": {"message", "type", "param",
"code"}}` on `/v1/models`, `/v1/embeddings` and `/v1/images/*` (what the OpenAI SDKs read); KServe v2's
`{"error": "..."}` on `/v2/*` (what tritonclient reads); `application/problem+json` (RFC 9457: `type`,
`title`, `status`, `detail`, `instance`, and `field` when one request field is at fault) everywhere else,
and on any route whose request sends `Accept: application/problem+json`. 429 and 503 carry
`Retry-After`; inference responses carry `RateLimit-Limit`, `RateLimit-Remaining`,
`RateLimit-Reset` and `RateLimit-Policy`.
"""


def create_app(
    settings: GatewaySettings,
    *,
    backend_factory: Callable[[GatewaySettings], InferenceBackend] | None = None,
    limiter_factory: Callable[[GatewaySettings], RateLimiter] | None = None,
) -> FastAPI:
    """Build the gateway.

    Args:
        settings: configuration.
        backend_factory: makes the inference backend at startup (default: Triton over the
            configured transport, HTTP or gRPC); unit tests pass a fake.
        limiter_factory: makes the rate limiter at startup (default: Redis if configured, else in process).

    Returns:
        The ASGI app; its lifespan opens and closes the Triton pool and the limiter.
    """
    parts = build_parts(settings)
    # Refused requests cost a token (charged after the answer, checked before the next body is read).
    refusals = RefusalCharge(settings, lambda: getattr(app.state, "limiter", None))
    app = FastAPI(
        title="Inference gateway",
        version="0.1.0",
        description=_DESCRIPTION,
        lifespan=make_lifespan(
            settings, parts, backend_factory or build_backend, limiter_factory or build_limiter
        ),
        middleware=_middleware(settings, parts, refusals),
        # FastAPI's native OpenTelemetry asks the global providers on every request whether it is
        # on; only opentelemetry-api is installed (no SDK), so it never is. Off: the question goes.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.tracker = parts.tracker
    app.state.meter = parts.meter
    app.state.key_store = parts.key_store
    app.state.traffic = parts.traffic
    app.state.state_sync = parts.sync
    app.state.authenticator = parts.authenticator
    app.state.renderer = parts.renderer
    app.state.images = build_image_store(settings)
    app.state.image_urls = ImageUrlSigner(
        settings.admin_token.get_secret_value() or settings.jwt_secret.get_secret_value()
    )
    install_error_handlers(app, parts.renderer)
    # Inference routes first: Starlette matches routes in order, and these carry the traffic.
    for module in (
        kserve,
        openai,
        jobs,
        classify,
        health,
        stats,
        usage,
        admin,
        residency_admin,
        traffic_routes,
    ):
        app.include_router(module.router)
    document_security(app, PUBLIC_PATHS, METRICS_PATHS)
    return app


def _middleware(
    settings: GatewaySettings, parts: AppParts, refusals: RefusalCharge
) -> list[Middleware]:
    """The middleware list, outermost first. Context wraps everything so even 401/413 answers get a
    request id and log line."""
    renderer = parts.renderer
    return [
        Middleware(
            ContextMiddleware,
            tracker=parts.tracker,
            meter=parts.meter,
            server_timing=settings.server_timing,
            refusals=refusals,
            retry_after=RetryAfterWatch(settings.hold_ignored_retry_after_s)
            if settings.hold_ignored_retry_after_s > 0
            else None,
        ),
        Middleware(DisconnectMiddleware),
        Middleware(
            BodyLimitMiddleware,
            max_bytes=settings.max_body_bytes,
            renderer=renderer,
            tier_max_bytes=lambda tier: settings.tier_limit(tier).max_body_bytes,
        ),
        Middleware(
            AuthMiddleware,
            authenticator=parts.authenticator,
            renderer=renderer,
            routes=AUTH_ROUTES,
            refusals=refusals,
        ),
        # Inside auth (the key's tier is known), outside decompression (the bytes the client sent).
        Middleware(
            InFlightBytesMiddleware,
            ledger=InFlightBytes(),
            bound=lambda tier: settings.tier_limit(tier).max_inflight_bytes,
            renderer=renderer,
            retry_after_s=settings.retry_after_s,
        ),
        # Inside auth: nothing is decompressed for a caller without credentials.
        Middleware(DecompressionMiddleware, max_bytes=settings.max_body_bytes, renderer=renderer),
        # Innermost: the inference path leaves here for the service; the framework sees the rest.
        Middleware(InferLane, renderer=renderer),
    ]
