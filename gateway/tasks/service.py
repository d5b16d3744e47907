"""The gateway's data plane: the model tasks, each behind admission control.

Protocol-neutral: no FastAPI, no REST models. Routes translate HTTP to these calls and back; the
Triton side is an :class:`gateway.backends.triton.InferenceBackend`, so this layer runs against a fake in
unit tests and the real server everywhere else. Admission (name, scope, limits, in-flight share,
deadline, priority) is :mod:`gateway.tenancy.admission`; request limits come from :mod:`serving.limits`, the
numbers the model configs carry. The reads of model information (metadata, configuration, readiness,
the repository index, statistics) are :mod:`gateway.tasks.model_reads`; the OpenAI tasks are
:mod:`gateway.tasks.openai`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from gateway.backends.catalog import ModelCatalog, check_model_name
from gateway.backends.model_breaker import Breakers
from gateway.backends.model_healer import ModelHealer
from gateway.backends.readiness import ReadinessProbe
from gateway.backends.triton import InferenceBackend, RawResponse, Tensor, timeout_us
from gateway.errors import BadRequest, Conflict, ModelNotFound
from gateway.observe.stats import LatencyTracker
from gateway.protocol.kserve import GrpcBody, InferRequest, ParseLimits, ParsePool, RestBody
from gateway.settings import GatewaySettings
from gateway.tasks.model_reads import ModelReads
from gateway.tenancy.admission import AdmissionControl, Ticket
from gateway.tenancy.context import RequestContext
from gateway.tenancy.ratelimit import RateLimiter
from gateway.tenancy.traffic import Route, TrafficSplit, check_target, check_version, check_weights
from serving.limits import DEFAULT_LIMITS, RequestLimits

__all__ = ["PARSE_INLINE_WORK", "Classification", "InferenceService", "ServiceOptions"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"RIFF")

#: KServe v2 requests whose checking costs up to this many bytes of JSON (``work_bytes``; 0.2-0.6 ms
#: by content) are checked on the event loop, costlier ones in a worker thread, and from
#: ``parse_process_min_bytes`` in a parse process (:class:`gateway.protocol.kserve.ParsePool`: JSON
#: decoding holds the GIL, so a thread would still stop the loop), so that one big request does not
#: hold every other request up (``python -m loadtest.parse_bench`` prints each
#: shape's weight and cost). Not every large body is costly: a 600 KB image tensor in binary is
#: checked in 50 us, while a hop to a thread and back costs a busy event loop far more (the parse
#: stage of 35-135 KB JPEGs took 1.4 ms through a thread at concurrency 8 on 2 cores, 0.09 ms on
#: the loop).
PARSE_INLINE_WORK = 8 * 1024


@dataclass(frozen=True)
class Classification:
    """Top-k labels for one image."""

    labels: list[str]
    scores: list[float]
    class_ids: list[int]


@dataclass(frozen=True)
class ServiceOptions:
    """The parts of an :class:`InferenceService` that have a default: one value, so the service
    takes its four required collaborators and this (the app passes traffic and the parse pool, unit
    tests nothing).

    Attributes:
        traffic: per-model version weights (canary routing); unpinned when ``None``.
        catalog: the known model names (default: read from the backend's repository index).
        limits: the request limits (default: :data:`serving.limits.DEFAULT_LIMITS`).
        parse_pool: the processes that parse REST bodies of ``parse_process_min_bytes`` and more
            (the app's; ``None``: a thread parses them).
    """

    traffic: TrafficSplit | None = None
    catalog: ModelCatalog | None = None
    limits: RequestLimits = DEFAULT_LIMITS
    parse_pool: ParsePool | None = None


class InferenceService(ModelReads):
    """The inference tasks the routes expose, each behind admission control.

    Args:
        settings: the gateway settings (timeouts, tiers, model names).
        backend: the inference server.
        limiter: the rate limiter (in process or Redis).
        tracker: latency and rejection statistics.
        options: traffic split, catalog, request limits and parse pool (each has a default).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        backend: InferenceBackend,
        limiter: RateLimiter,
        tracker: LatencyTracker,
        options: ServiceOptions = ServiceOptions(),
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.limiter = limiter
        self.tracker = tracker
        self.traffic = options.traffic or TrafficSplit()
        self.limits = options.limits
        self.catalog = options.catalog or ModelCatalog(
            backend,
            aliases=settings.model_aliases,
            ttl_s=settings.model_index_ttl_s,
            min_refresh_s=settings.model_index_min_refresh_s,
            timeout_s=settings.triton_health_timeout_s * 4,
        )
        self.healer = ModelHealer(
            backend,
            Breakers(settings.breaker_failures),
            tracker.registry,
            load_timeout_s=settings.heal_load_timeout_s,
            probe_timeout_s=settings.ready_timeout_s,
            max_backoff_s=settings.heal_max_backoff_s,
            under_rollout=self.traffic.splits,
        )
        self.admission = AdmissionControl(settings, self.catalog, limiter, tracker, self.healer)
        self.readiness = ReadinessProbe(
            backend,
            [self.catalog.alias(m) for m in settings.ready_models],
            cache_s=settings.ready_cache_s,
            timeout_s=settings.ready_timeout_s,
        )
        self._parse_limits = ParseLimits()
        self.parse_pool = options.parse_pool

    def resolve(self, model: str) -> str:
        """The Triton model behind a public name (aliases from the settings; no lookup)."""
        return self.catalog.alias(model)

    async def _infer(
        self, ctx: RequestContext, ticket: Ticket, inputs: Sequence[Tensor], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        route = self.traffic.route(ticket.model)
        with ctx.stages.stage("upstream"):
            return await self.infer_routed(route, ticket, inputs, outputs)

    async def infer_routed(
        self, route: Route, ticket: Ticket, inputs: Sequence[Tensor], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run ``inputs`` on the version ``route`` names, under the ticket's deadline and priority;
        the outcome counts for the canary of the ticket's model (see :meth:`routed`)."""
        return await self.routed(
            ticket.model,
            route,
            self.backend.infer(
                route.model,
                inputs,
                outputs,
                timeout_s=ticket.remaining_s(),
                version=route.version,
                priority=ticket.priority,
            ),
        )

    async def routed(self, model: str, route: Route, call: Awaitable[T]) -> T:
        """Await a call the traffic split routed, counting its outcome for ``model``'s canary."""
        try:
            result = await call
        except BadRequest:
            self.traffic.observe(model, route, ok=True)  # the client's fault, not the version's
            raise
        except Exception:
            self.traffic.observe(model, route, ok=False)
            raise
        self.traffic.observe(model, route, ok=True)
        return result

    # -- KServe v2 ---------------------------------------------------------------------------

    async def infer_v2(
        self,
        ctx: RequestContext,
        model: str,
        request: InferRequest | RestBody | GrpcBody,
        *,
        version: str = "",
        accept_encoding: str = "identity",
    ) -> RawResponse:
        """KServe v2 inference: Triton runs exactly the checked request, re-encoded.

        A REST body (or gRPC message) is checked only after admission (a refused caller costs no
        parsing), and off the event loop when it is large.

        Args:
            ctx: the request's context.
            model: the public model name.
            request: a checked request (built by the caller), or a REST body or gRPC message to check.
            version: a version the client named; '' lets the traffic split choose.
            accept_encoding: how Triton may compress its answer (``gzip``, ``deflate``, ``identity``).

        Raises:
            BadRequest: the body is malformed (the field is named).
        """
        version = check_version(version) if version else ""
        async with self.admission.admit(ctx, model) as ticket:
            if isinstance(request, RestBody | GrpcBody):
                with ctx.stages.stage("parse"):
                    request = await self._parse(request)
            if request.model_name and request.model_name != model:
                raise BadRequest(
                    f"the body names model '{request.model_name}' but the path names '{model}'",
                    field="model_name",
                )
            request = _apply_policy(request, ticket)
            # A version the client named is served as asked; otherwise the canary weights route.
            route = Route(ticket.model, version) if version else self.traffic.route(ticket.model)
            call = self.backend.infer_v2(
                route.model,
                request,
                timeout_s=ticket.remaining_s(),
                version=route.version,
                accept_encoding=accept_encoding,
            )
            with ctx.stages.stage("upstream"):
                return await (call if version else self.routed(ticket.model, route, call))

    async def _parse(self, body: RestBody | GrpcBody) -> InferRequest:
        work = body.work_bytes
        if work <= PARSE_INLINE_WORK:
            return body.parse(self._parse_limits)
        if (
            self.parse_pool is not None
            and isinstance(body, RestBody)
            and work >= self.settings.parse_process_min_bytes
        ):
            # A thread would still hold the GIL (JSON decoding is C code that keeps it): a worker
            # process parses it and the event loop only copies the body out and the arrays back.
            return await self.parse_pool.parse(body.body, body.header_length, self._parse_limits)
        return await asyncio.to_thread(body.parse, self._parse_limits)

    # -- admin -------------------------------------------------------------------------------

    async def pin_traffic(self, model: str, weights: Mapping[str, float]) -> None:
        """Route ``model``'s traffic by weight (to its versions, or to ``model:<name>`` targets), once
        every target with a positive weight is READY.

        Raises:
            BadRequest: a malformed model name, target or weight (the field is named).
            ModelNotFound: Triton does not serve ``model``.
            Conflict: a target with a positive weight is not READY in Triton (named).
        """
        check_model_name(model)
        if model not in await self.catalog.known(model):
            raise ModelNotFound(model)
        check_weights(weights)  # malformed input is a 400 before Triton is asked anything
        timeout = self.settings.triton_health_timeout_s * 4
        for target, weight in weights.items():
            route = check_target(target)
            model_name, version = (route.model, "") if isinstance(route, Route) else (model, route)
            if weight > 0 and not await self.backend.model_ready(
                model_name, timeout_s=timeout, version=version
            ):
                what = (
                    f"model '{model_name}'"
                    if isinstance(route, Route)
                    else f"version {version} of model '{model}'"
                )
                raise Conflict(
                    f"{what} is not READY in Triton; load it before sending traffic to it",
                    field=f"versions.{target}",
                )
        await self.traffic.update(model, weights)

    # -- tasks -------------------------------------------------------------------------------

    async def classify(self, ctx: RequestContext, images: Sequence[bytes]) -> list[Classification]:
        """Top-5 classes for each encoded image, through the classifier ensemble.

        Raises:
            BadRequest: too many files, or one that is empty, too large or not an image (``field='file'``).
            ModelNotFound: the classifier is not served.
        """
        limits = self.limits.image_upload
        if not images:
            raise BadRequest("no image sent", field="file")
        if len(images) > limits.max_count:
            raise BadRequest(
                f"{len(images)} files sent; at most {limits.max_count} per request", field="file"
            )
        for index, data in enumerate(images):
            if not data:
                raise BadRequest(f"file {index} is empty", field="file")
            if len(data) > limits.max_bytes:
                raise BadRequest(
                    f"file {index} is {len(data)} bytes; at most {limits.max_bytes} per image",
                    field="file",
                )
            if not data.startswith(_IMAGE_MAGIC):
                raise BadRequest(
                    f"file {index} is not a JPEG, PNG, GIF, BMP or WebP image", field="file"
                )
        batch = np.array([[d] for d in images], dtype=np.object_)
        async with self.admission.admit(ctx, self.settings.classifier_model) as ticket:
            out = await self._infer(
                ctx, ticket, [Tensor("IMAGE", batch)], ["LABELS", "SCORES", "CLASS_IDS"]
            )
        ctx.usage.images = len(images)
        labels, scores, ids = out["LABELS"], out["SCORES"], out["CLASS_IDS"]
        return [
            Classification(
                labels=[x.decode() if isinstance(x, bytes) else str(x) for x in labels[i]],
                scores=[float(s) for s in scores[i]],
                class_ids=[int(c) for c in ids[i]],
            )
            for i in range(len(images))
        ]


def _apply_policy(request: InferRequest, ticket: Ticket) -> InferRequest:
    """What the gateway decides, not the client: the priority (the tier's), and a Triton timeout no
    longer than what is left of the gateway's deadline (the client's own when it is shorter)."""
    remaining_us = timeout_us(ticket.remaining_s())
    theirs = request.timeout_us
    timeout = theirs if theirs is not None and 0 < theirs < remaining_us else remaining_us
    return replace(request, priority=ticket.priority, timeout_us=timeout)
