"""The app factory: ``create_app(settings) -> FastAPI``.

Owns the wiring and nothing else: the one table from exceptions to HTTP statuses, the middleware
list, the routers, and a lifespan that opens (and closes) the Triton client pool, the rate limiter,
the Triton statistics poller, the shared-state sync (with Redis), the generation job store and its
workers, and the KServe v2 gRPC entry when a port is set for it. Nothing happens at import time.
What backs each store is chosen in :mod:`gateway.app_stores`; :mod:`gateway.http.validation_report` words
validation failures and :mod:`gateway.routes.openapi_doc` finishes the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware

from gateway import errors
from gateway.app_stores import (
    build_backend,
    build_image_store,
    build_job_store,
    build_limiter,
    build_sketch_store,
    build_usage_store,
)
from gateway.backends.model_cards import ModelCards
from gateway.backends.residency import ResidencyManager
from gateway.backends.residency_setup import build_residency
from gateway.backends.triton import InferenceBackend
from gateway.http.body_bytes import InFlightBytesMiddleware
from gateway.http.compression import DecompressionMiddleware
from gateway.http.middleware import (
    AuthMiddleware,
    BodyLimitMiddleware,
    ContextMiddleware,
    DisconnectMiddleware,
)
from gateway.http.problems import ErrorReport, ErrorShape, ProblemRenderer
from gateway.http.validation_report import validation_report
from gateway.jobs.callbacks import CallbackPolicy, CallbackSender
from gateway.jobs.image_urls import ImageUrlSigner
from gateway.jobs.runner import JobRunner
from gateway.jobs.service import ImageJobs
from gateway.jobs.store import JobStore
from gateway.observe.stats import LatencyTracker
from gateway.observe.timing import watch_event_loop
from gateway.protocol.kserve import ParsePool
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
from gateway.routes.kserve_grpc import start_grpc_server
from gateway.routes.openapi_doc import document_security
from gateway.settings import GatewaySettings
from gateway.tasks.openai import OpenAITasks
from gateway.tasks.service import InferenceService
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.context import CONTEXT_KEY
from gateway.tenancy.inflight_bytes import InFlightBytes
from gateway.tenancy.key_stores import open_key_store
from gateway.tenancy.keys import KeyStore
from gateway.tenancy.ratelimit import RateLimiter
from gateway.tenancy.refusals import RefusalCharge
from gateway.tenancy.state_sync import StateSync
from gateway.tenancy.traffic import TrafficSplit
from gateway.tenancy.usage import UsageMeter, UsageStore, UsageStoreError
from serving.limits import DEFAULT_LIMITS

__all__ = ["ERROR_SHAPES", "ERROR_STATUS", "create_app"]

log = logging.getLogger(__name__)

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

_DESCRIPTION = """\
Authenticated, rate-limited access to the models Triton serves.

**Credentials**: `Authorization: Bearer <api key | JWT>` or `X-API-Key: <api key>`; the admin API takes
`X-Admin-Token` (or `Authorization: Bearer <admin token>`); `/metrics` takes
`Authorization: Bearer <metrics token>` (`GATEWAY_METRICS_TOKEN`, or the admin token).

**Errors** take the shape of the API a route belongs to: OpenAI's `{"error": {"message", "type", "param",
"code"}}` on `/v1/models`, `/v1/embeddings` and `/v1/images/*` (what the OpenAI SDKs read); KServe v2's
`{"error": "..."}` on `/v2/*` (what tritonclient reads); `application/problem+json` (RFC 9457: `type`,
`title`, `status`, `detail`, `instance`, and `field` when one request field is at fault) everywhere else,
and on any route whose request sends `Accept: application/problem+json`. 429 and 503 carry `Retry-After`; inference responses carry
`RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and `RateLimit-Policy`.
"""


async def _poll_triton_stats(
    backend: InferenceBackend, tracker: LatencyTracker, interval_s: float
) -> None:
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


Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


@dataclass
class _Parts:
    """What the app is built from before it starts: shared by the middleware, the routes (through
    ``app.state``) and the lifespan."""

    renderer: ProblemRenderer
    tracker: LatencyTracker
    meter: UsageMeter
    key_store: KeyStore
    redis_client: Any
    traffic: TrafficSplit
    authenticator: Authenticator
    sync: StateSync | None
    callbacks: CallbackPolicy


@dataclass
class _Running:
    """What the lifespan started, to stop in order."""

    backend: InferenceBackend
    limiter: RateLimiter
    residency: ResidencyManager | None
    job_store: JobStore
    usage_store: UsageStore
    sender: CallbackSender | None
    grpc_server: Any
    tasks: list[asyncio.Task[None]]


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
    parts = _build_parts(settings)
    # Refused requests cost a token (charged after the answer, checked before the next body is read).
    refusals = RefusalCharge(settings, lambda: getattr(app.state, "limiter", None))
    app = FastAPI(
        title="Inference gateway",
        version="0.1.0",
        description=_DESCRIPTION,
        lifespan=_lifespan(
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
    _install_error_handlers(app, parts.renderer)
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
    # First of all: the inference path as a plain route (see kserve.hot_routes: FastAPI's matching
    # and dependency solving cost more CPU than the rest of the request's routing).
    app.router.routes[0:0] = kserve.hot_routes()
    document_security(app, PUBLIC_PATHS, METRICS_PATHS)
    return app


def _build_parts(settings: GatewaySettings) -> _Parts:
    """The app's long-lived parts, built before it starts (no I/O beyond opening the key store)."""
    tracker = LatencyTracker(
        settings.stats_window_s,
        settings.stats_bucket_s,
        settings.stats_max_series,
        settings.max_client_labels,
    )
    # With Redis, keys and canary weights live there (every replica and worker sees one truth);
    # without it, keys are the SQLite file and weights stay in this single process.
    store = open_key_store(settings)
    redis_client = None
    if settings.shared:
        from gateway.tenancy.redis_state import RedisTrafficStore, connect, read_versions

        redis_client = connect(settings.redis_url.get_secret_value(), settings.redis_timeout_s)
        traffic = TrafficSplit(store=RedisTrafficStore(redis_client, settings.redis_prefix))
    else:
        traffic = TrafficSplit()
    authenticator = Authenticator(settings, store)
    sync = None
    if redis_client is not None:
        client = redis_client
        sync = StateSync(
            lambda: read_versions(client, settings.redis_prefix),
            authenticator.clear,
            traffic,
            settings.state_sync_interval_s,
        )
    callbacks = CallbackPolicy(
        settings.callback_allow,
        settings.callback_private_networks,
        max_url_chars=DEFAULT_LIMITS.jobs.max_callback_url_chars,
        resolve_timeout_s=settings.callback_timeout_s,
    )
    return _Parts(
        ProblemRenderer(ERROR_STATUS, ERROR_SHAPES),
        tracker,
        UsageMeter(),
        store,
        redis_client,
        traffic,
        authenticator,
        sync,
        callbacks,
    )


def _middleware(
    settings: GatewaySettings, parts: _Parts, refusals: RefusalCharge
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
            public=PUBLIC_PATHS,
            public_prefixes=PUBLIC_PREFIXES,
            metrics_paths=METRICS_PATHS,
            signed_paths=SIGNED_PATHS,
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
    ]


def _lifespan(
    settings: GatewaySettings,
    parts: _Parts,
    make_backend: Callable[[GatewaySettings], InferenceBackend],
    make_limiter: Callable[[GatewaySettings], RateLimiter],
) -> Lifespan:
    """The lifespan: start the services and background tasks, and stop them in order."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running = await _start(app, settings, parts, make_backend(settings), make_limiter(settings))
        try:
            yield
        finally:
            await _stop(app, parts, running)

    return lifespan


async def _start(
    app: FastAPI,
    settings: GatewaySettings,
    parts: _Parts,
    backend: InferenceBackend,
    limiter: RateLimiter,
) -> _Running:
    """Put the services on ``app.state`` and start the background tasks (and the gRPC entry)."""
    tracker, meter = parts.tracker, parts.meter
    app.state.backend = backend
    app.state.limiter = limiter
    parse_pool = None
    if settings.parse_workers:
        parse_pool = ParsePool(settings.parse_workers, settings.retry_after_s)
        parse_pool.start()
    app.state.parse_pool = parse_pool
    app.state.service = InferenceService(
        settings, backend, limiter, tracker, parts.traffic, parse_pool=parse_pool
    )
    residency = build_residency(
        settings, settings.triton_http_url, settings.keys_db, tracker.registry
    )
    if residency is not None:
        await residency.start()
        app.state.service.admission.residency = residency
    app.state.residency = residency
    app.state.openai = OpenAITasks(
        app.state.service, ModelCards(backend, timeout_s=settings.triton_health_timeout_s * 4)
    )
    job_store = build_job_store(settings)
    sender = None
    if parts.callbacks.enabled:
        sender = CallbackSender(
            parts.callbacks,
            settings.callback_secret.get_secret_value().encode(),
            settings.callback_timeout_s,
        )
    runner = JobRunner(settings, job_store, app.state.openai, parts.renderer, meter, sender)
    app.state.job_runner = runner
    app.state.jobs = ImageJobs(app.state.openai, job_store, parts.callbacks, wake=runner.wake)
    tracker.store = build_sketch_store(settings)
    tracker.remote_ttl_s = settings.stats_publish_interval_s
    tracker.forget_dead_workers()
    meter.store = usage_store = build_usage_store(settings)
    grpc_server = None
    if settings.grpc_port:
        # Same process, same event loop, same service: the KServe v2 gRPC entry.
        grpc_server = await start_grpc_server(
            settings, app.state.service, parts.authenticator, parts.renderer, tracker, meter
        )
    tasks = [
        asyncio.create_task(meter.flush_forever(settings.usage_flush_interval_s)),
        asyncio.create_task(runner.run()),
        asyncio.create_task(watch_event_loop(tracker.loop_lag.observe)),
    ]
    if tracker.store is not None:
        tasks.append(
            asyncio.create_task(tracker.publish_forever(settings.stats_publish_interval_s))
        )
    if settings.triton_stats_interval_s > 0:
        tasks.append(
            asyncio.create_task(
                _poll_triton_stats(backend, tracker, settings.triton_stats_interval_s)
            )
        )
    if parts.sync is not None:
        await parts.sync.refresh()  # canary weights in place before the first request
        tasks.append(asyncio.create_task(parts.sync.run()))
    return _Running(backend, limiter, residency, job_store, usage_store, sender, grpc_server, tasks)


async def _stop(app: FastAPI, parts: _Parts, running: _Running) -> None:
    """Stop what :func:`_start` started: the gRPC entry, the tasks, then flush and close each store."""
    tracker, meter = parts.tracker, parts.meter
    if running.grpc_server is not None:
        await running.grpc_server.stop(grace=5)
    for task in running.tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await tracker.publish()  # the last seconds of traffic, for the processes that remain
    try:
        await meter.flush()
    except UsageStoreError as exc:
        log.error("usage metering: the last counts could not be stored: %s", exc)
    if tracker.store is not None:
        await tracker.store.close()
    await running.usage_store.close()
    if running.sender is not None:
        await running.sender.close()
    await running.job_store.close()
    await app.state.images.close()
    await app.state.service.catalog.close()
    await app.state.service.healer.close()
    if app.state.parse_pool is not None:
        app.state.parse_pool.close()
    if running.residency is not None:
        await running.residency.close()
    await running.backend.close()
    await running.limiter.close()
    parts.key_store.close()
    if parts.redis_client is not None:
        parts.redis_client.close()


def _install_error_handlers(app: FastAPI, renderer: ProblemRenderer) -> None:
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
        return answer(
            request,
            ErrorReport(
                500, "Internal server error", "the gateway failed; see its log", "internal_error"
            ),
        )

    app.add_exception_handler(errors.GatewayError, gateway_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
