"""The app's lifespan: what starts when the gateway starts (the Triton client pool, the rate limiter,
the parse processes, residency, the job runner, the stores, the KServe v2 gRPC entry, the background
tasks) and stops, in order, when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from gateway import errors
from gateway.app.parts import AppParts
from gateway.app.stores import build_job_store, build_sketch_store, build_usage_store
from gateway.backends.model_cards import ModelCards
from gateway.backends.residency import ResidencyManager
from gateway.backends.residency_setup import build_residency
from gateway.backends.triton import InferenceBackend
from gateway.jobs.callback_sender import CallbackSender
from gateway.jobs.runner import JobRunner
from gateway.jobs.service import ImageJobs
from gateway.jobs.store import JobStore
from gateway.observe.gc_pauses import GcPauses
from gateway.observe.stats import LatencyTracker
from gateway.observe.timing import watch_event_loop
from gateway.protocol.kserve import ParsePool
from gateway.routes.kserve_grpc import start_grpc_server
from gateway.settings import GatewaySettings
from gateway.tasks.openai import OpenAITasks
from gateway.tasks.service import InferenceService, ServiceOptions
from gateway.tenancy.ratelimit import RateLimiter
from gateway.tenancy.usage import UsageStore, UsageStoreError

__all__ = ["Lifespan", "make_lifespan"]

log = logging.getLogger("gateway.app")

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


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
    gc_pauses: GcPauses


def make_lifespan(
    settings: GatewaySettings,
    parts: AppParts,
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
    parts: AppParts,
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
        settings,
        backend,
        limiter,
        tracker,
        ServiceOptions(traffic=parts.traffic, parse_pool=parse_pool),
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
    # Last: a start that failed above leaves no callback inside the collector.
    gc_pauses = GcPauses()
    gc_pauses.install()
    tasks.append(asyncio.create_task(gc_pauses.observe_forever(tracker.observe_gc_pause)))
    return _Running(
        backend, limiter, residency, job_store, usage_store, sender, grpc_server, tasks, gc_pauses
    )


async def _stop(app: FastAPI, parts: AppParts, running: _Running) -> None:
    """Stop what :func:`_start` started: the gRPC entry, the tasks, then flush and close each store."""
    tracker, meter = parts.tracker, parts.meter
    if running.grpc_server is not None:
        await running.grpc_server.stop(grace=5)
    for task in running.tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    running.gc_pauses.remove()
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
