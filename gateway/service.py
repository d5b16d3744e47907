"""The gateway's data plane: admission (scope, rate limit, in-flight bound) and the model tasks.

Protocol-neutral: no FastAPI, no REST models. Routes translate HTTP to these calls and back; the
Triton side is an :class:`gateway.triton.InferenceBackend`, so this layer runs against a fake in
unit tests and the real server everywhere else.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.context import RequestContext
from gateway.errors import BadRequest, ModelNotFound, Overloaded, PermissionDenied, RateLimited
from gateway.ratelimit import RateLimiter
from gateway.settings import GatewaySettings
from gateway.stats import LatencyTracker
from gateway.traffic import TrafficSplit
from gateway.triton import InferenceBackend, RawResponse, Tensor

__all__ = ["Classification", "InferenceService", "ModelInfo"]

log = logging.getLogger(__name__)

_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"RIFF")
_MAX_IMAGE_SIDE = 2048
_MAX_GENERATION_STEPS = 150


@dataclass(frozen=True)
class ModelInfo:
    """A model Triton knows about."""

    name: str
    version: str
    state: str


@dataclass(frozen=True)
class Classification:
    """Top-k labels for one image."""

    labels: list[str]
    scores: list[float]
    class_ids: list[int]


class InferenceService:
    """Admission control plus the inference tasks the routes expose.

    Args:
        settings: the gateway settings (limits, timeouts, model names).
        backend: the inference server.
        limiter: the rate limiter (in process or Redis).
        tracker: latency and rejection statistics.
        traffic: per-model version weights (canary routing); unpinned when ``None``.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        backend: InferenceBackend,
        limiter: RateLimiter,
        tracker: LatencyTracker,
        traffic: TrafficSplit | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.limiter = limiter
        self.tracker = tracker
        self.traffic = traffic or TrafficSplit()
        self._in_flight: dict[str, int] = {}

    # -- admission ---------------------------------------------------------------------------

    def resolve(self, model: str) -> str:
        """The Triton model behind a public name (aliases from the settings)."""
        return self.settings.model_aliases.get(model, model)

    @asynccontextmanager
    async def admit(self, ctx: RequestContext, model: str) -> AsyncIterator[None]:
        """Let one request for ``model`` through, or refuse it before it reaches Triton.

        Order matters: scope (403) before the rate limit, so an out-of-scope caller cannot drain a
        bucket; the rate limit before the in-flight slot, so a refused request holds nothing.

        Args:
            ctx: the request's context (``principal`` set by authentication).
            model: the Triton model.

        Raises:
            PermissionDenied: the caller's scopes do not include ``model``.
            RateLimited: the caller's bucket for ``model`` is empty.
            Overloaded: ``max_in_flight_per_model`` requests for ``model`` are already running.
            RateLimiterUnavailable: Redis is down and the policy is closed.
        """
        principal = ctx.principal
        if principal is None:  # routes are behind the auth middleware; this is a wiring bug
            raise RuntimeError("admit() called without an authenticated principal")
        if not principal.allows(model):
            self.tracker.reject("scope")
            raise PermissionDenied(f"this credential is not allowed to use model '{model}'", field="model")
        limit = self.settings.tier_limit(principal.tier)
        decision = await self.limiter.hit(f"{principal.client_id}:{model}", limit)
        ctx.rate = decision
        if not decision.allowed:
            self.tracker.reject("rate_limit")
            raise RateLimited(
                f"rate limit for model '{model}' exceeded (tier '{principal.tier}': {limit.per_minute:g}/min, "
                f"burst {limit.burst})",
                retry_after_s=decision.retry_after_s,
                headers=decision.headers(),
            )
        running = self._in_flight.get(model, 0)
        if running >= self.settings.max_in_flight_per_model:
            # 429 rather than 503: load shedding the client should back off from, not an outage.
            self.tracker.reject("in_flight")
            raise Overloaded(
                f"model '{model}' already has {running} requests in flight (limit "
                f"{self.settings.max_in_flight_per_model}); retry shortly",
                retry_after_s=self.settings.retry_after_s,
            )
        self._in_flight[model] = running + 1
        self.tracker.in_flight.labels(model).inc()
        ctx.model = model
        ctx.admitted = True
        try:
            yield
        finally:
            self._in_flight[model] -= 1
            self.tracker.in_flight.labels(model).dec()

    # -- KServe v2 ---------------------------------------------------------------------------

    async def infer_raw(
        self, ctx: RequestContext, model: str, body: bytes, headers: dict[str, str]
    ) -> RawResponse:
        """KServe v2 passthrough: the encoded request goes to Triton untouched.

        Raises:
            BadRequest: an input declares more elements than the body could carry (``field='inputs'``).
        """
        model = self.resolve(model)
        async with self.admit(ctx, model):
            _check_declared_sizes(body, headers)
            return await self.backend.infer_raw(
                model, body, headers, timeout_s=self.settings.upstream_timeout_s, version=self.traffic.pick(model)
            )

    async def model_metadata(self, ctx: RequestContext, model: str) -> dict[str, Any]:
        model = self.resolve(model)
        self._check_scope(ctx, model)
        return await self.backend.model_metadata(model, timeout_s=self.settings.triton_health_timeout_s * 4)

    async def model_ready(self, ctx: RequestContext, model: str) -> bool:
        """Whether ``model`` is READY.

        Raises:
            ModelNotFound: Triton's repository has no such model.
        """
        model = self.resolve(model)
        self._check_scope(ctx, model)
        timeout = self.settings.triton_health_timeout_s
        if await self.backend.model_ready(model, timeout_s=timeout):
            return True
        # Not ready: tell "loading/unavailable" (False, a 503) from "not in the repository" (404).
        if model not in {m["name"] for m in await self.backend.repository_index(timeout_s=timeout * 4)}:
            raise ModelNotFound(model)
        return False

    def _check_scope(self, ctx: RequestContext, model: str) -> None:
        if ctx.principal is None or not ctx.principal.allows(model):
            raise PermissionDenied(f"this credential is not allowed to use model '{model}'", field="model")

    async def list_models(self, ctx: RequestContext) -> list[ModelInfo]:
        """Models in Triton's repository that the caller may use."""
        index = await self.backend.repository_index(timeout_s=self.settings.triton_health_timeout_s * 4)
        principal = ctx.principal
        return [
            ModelInfo(name=m["name"], version=str(m.get("version", "")), state=str(m.get("state", "UNKNOWN")))
            for m in index
            if principal is not None and principal.allows(m["name"])
        ]

    async def ready(self) -> bool:
        """Ready only when Triton says it is (a short, bounded probe)."""
        return await self.backend.server_ready(timeout_s=self.settings.triton_health_timeout_s)

    # -- tasks -------------------------------------------------------------------------------

    async def classify(self, ctx: RequestContext, images: Sequence[bytes]) -> list[Classification]:
        """Top-5 classes for each encoded image, through the classifier ensemble.

        Raises:
            BadRequest: a file is empty or not an image (``field='file'``).
            ModelNotFound: the classifier is not served.
        """
        model = self.settings.classifier_model
        for index, data in enumerate(images):
            if not data:
                raise BadRequest(f"file {index} is empty", field="file")
            if not data.startswith(_IMAGE_MAGIC):
                raise BadRequest(f"file {index} is not a JPEG, PNG, GIF, BMP or WebP image", field="file")
        batch = np.array([[d] for d in images], dtype=np.object_)
        async with self.admit(ctx, model):
            out = await self.backend.infer(
                model,
                [Tensor("IMAGE", batch)],
                ["LABELS", "SCORES", "CLASS_IDS"],
                timeout_s=self.settings.upstream_timeout_s,
                version=self.traffic.pick(model),
            )
        labels, scores, ids = out["LABELS"], out["SCORES"], out["CLASS_IDS"]
        return [
            Classification(
                labels=[x.decode() if isinstance(x, bytes) else str(x) for x in labels[i]],
                scores=[float(s) for s in scores[i]],
                class_ids=[int(c) for c in ids[i]],
            )
            for i in range(len(images))
        ]

    async def embed(self, ctx: RequestContext, model: str, texts: Sequence[str]) -> list[list[float]]:
        """L2-normalised embeddings, one per text.

        Raises:
            BadRequest: no text, or an empty one (``field='input'``).
            ModelNotFound: the embedding model is not served (yet).
        """
        triton_model = self.resolve(model)
        if triton_model != self.settings.embedding_model and model not in self.settings.model_aliases:
            raise ModelNotFound(
                model, f"model '{model}' is not an embedding model (use '{self.settings.embedding_model}')"
            )
        if not texts:
            raise BadRequest("input must hold at least one string", field="input")
        for index, text in enumerate(texts):
            if not text:
                raise BadRequest(f"input[{index}] is empty", field=f"input.{index}")
        batch = np.array([[t.encode()] for t in texts], dtype=np.object_)
        async with self.admit(ctx, triton_model):
            out = await self.backend.infer(
                triton_model,
                [Tensor("TEXT", batch)],
                ["EMBEDDING"],
                timeout_s=self.settings.upstream_timeout_s,
                version=self.traffic.pick(triton_model),
            )
        return [[float(v) for v in row] for row in out["EMBEDDING"]]

    async def generate_image(
        self,
        ctx: RequestContext,
        prompt: str,
        *,
        model: str | None = None,
        width: int,
        height: int,
        negative_prompt: str = "",
        steps: int = 20,
        guidance: float = 7.5,
        seed: int = 0,
    ) -> str:
        """One image from ``prompt``, as base64 PNG.

        Raises:
            BadRequest: a parameter is out of range (the field is named).
            ModelNotFound: the diffusion model is not served (yet).
        """
        if not prompt.strip():
            raise BadRequest("prompt must not be empty", field="prompt")
        for name, side in (("width", width), ("height", height)):
            if not 64 <= side <= _MAX_IMAGE_SIDE or side % 8:
                raise BadRequest(
                    f"{name} must be a multiple of 8 between 64 and {_MAX_IMAGE_SIDE}", field="size"
                )
        if not 1 <= steps <= _MAX_GENERATION_STEPS:
            raise BadRequest(f"steps must be between 1 and {_MAX_GENERATION_STEPS}", field="steps")
        model = self.resolve(model or self.settings.image_generation_model)
        inputs = [
            Tensor("PROMPT", np.array([prompt.encode()], dtype=np.object_)),
            Tensor("NEGATIVE_PROMPT", np.array([negative_prompt.encode()], dtype=np.object_)),
            Tensor("STEPS", np.array([steps], dtype=np.int32)),
            Tensor("GUIDANCE", np.array([guidance], dtype=np.float32)),
            Tensor("HEIGHT", np.array([height], dtype=np.int32)),
            Tensor("WIDTH", np.array([width], dtype=np.int32)),
            Tensor("SEED", np.array([seed], dtype=np.int64)),
        ]
        async with self.admit(ctx, model):
            out = await self.backend.infer(
                model, inputs, ["IMAGE"], timeout_s=self.settings.upstream_timeout_s, version=self.traffic.pick(model)
            )
        # PNG encoding is CPU work: keep it off the event loop.
        return await asyncio.to_thread(_png_base64, out["IMAGE"])


_SHAPE = re.compile(rb'"shape"\s*:\s*\[([^\]]*)\]')


def _check_declared_sizes(body: bytes, headers: dict[str, str]) -> None:
    """Refuse a KServe v2 request whose inputs declare more elements than its body has bytes.

    Every element takes at least one byte of the body (a JSON number, a binary value), so a larger
    shape cannot be honest. Triton 2.51 sizes a buffer from the declared shape before it reads the
    data and aborts (the whole server dies) when that is huge, so one such request from any client
    would take every model down. Only the JSON header is scanned (C-speed regex, no parsing).
    """
    header = body
    declared = headers.get("inference-header-content-length", "").strip()
    if declared.isdigit():
        header = body[: int(declared)]
    for dims in _declared_shapes(header):
        if any(d <= 0 for d in dims):
            continue  # empty tensors are fine; negative dims are Triton's to refuse
        count = 1
        for dim in dims:
            count *= dim
            if count > len(body):
                raise BadRequest(
                    f"an input declares a shape of at least {count} elements, more than the "
                    f"{len(body)}-byte body can hold",
                    field="inputs",
                )


def _declared_shapes(header: bytes) -> Iterator[list[int]]:
    if b"\\u" not in header:  # no escapes, so every "shape" key is spelled out: a regex finds them all
        for match in _SHAPE.finditer(header):
            try:
                yield [int(d) for d in match.group(1).split(b",") if d.strip()]
            except ValueError:
                continue  # not integers: Triton refuses it and names the field
        return
    try:  # a key may be spelled with escapes ("\\u0073hape"): parse for real
        doc = json.loads(header)
    except (ValueError, RecursionError):
        return  # not JSON: Triton refuses it
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    for item in inputs if isinstance(inputs, list) else []:
        shape = item.get("shape") if isinstance(item, dict) else None
        if isinstance(shape, list) and all(type(d) is int for d in shape):
            yield shape


def _png_base64(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
