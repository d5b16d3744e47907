"""The OpenAI-compatible tasks: model listing, embeddings, image generation.

Protocol-neutral like :mod:`gateway.service` (no FastAPI, no REST models): the routes in
:mod:`gateway.routes.openai` translate HTTP to these calls. Admission (name, scope, rate limits,
in-flight share, deadline and priority: :mod:`gateway.tenancy.admission`) and the Triton backend are the
service's; what a model is and allows comes from its card
(:mod:`gateway.backends.model_cards`); request limits from :mod:`serving.limits`.

- Listing: Triton's READY models in the caller's scope, without internal pipeline steps (their card
  says ``visibility: internal``), plus configured aliases of listed models.
- Embeddings: up to ``max_inputs`` strings or token-id arrays of the model's own vocabulary (WordPiece
  for MiniLM; the model's tokenizer refuses ids that text never produces, so ids of another tokenizer
  such as tiktoken's are refused, not misread), split into the model's ``max_batch_size``, run under
  one admission with a bounded number of chunks in Triton at once, answered in order; ``usage`` is the
  tokenizer's count; ``dimensions`` (1 to the model's length) truncates and re-normalises the vectors.
  The card's Matryoshka lengths say where that keeps the model's quality (a model trained for it).
- Images: ``n`` pipeline runs (seeds ``seed``, ``seed + 1``, ...) under one admission, encoded as
  PNG, JPEG or WebP off the event loop; now (:meth:`OpenAITasks.generate_images`), or as a job
  (:mod:`gateway.jobs.runner`) that passed admission when it was submitted and takes only its
  in-flight slot when it runs (:meth:`OpenAITasks.run_image_job`).
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from gateway.backends.model_cards import ModelCards
from gateway.backends.triton import Tensor
from gateway.errors import (
    BadRequest,
    GatewayError,
    InferenceInputError,
    ModelNotFound,
    UpstreamTimeout,
)
from gateway.observe.generation_pace import GenerationPace, generation_work
from gateway.service import InferenceService
from gateway.tenancy.admission import Ticket
from gateway.tenancy.context import RequestContext
from serving.limits import DEFAULT_LIMITS, RequestLimits
from serving.model_card import ModelCard, Task
from serving.token_ids import token_row_of

__all__ = ["IMAGE_FORMATS", "Embeddings", "ImageRequest", "OpenAITasks", "PublicModel"]

#: output_format -> (Pillow format, media type)
IMAGE_FORMATS = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "webp": ("WEBP", "image/webp"),
}


@dataclass(frozen=True)
class PublicModel:
    """A model a client can call, as ``/v1/models`` lists it."""

    id: str
    created: int
    task: Task | None
    #: with residency on (:mod:`gateway.backends.residency`): its state and footprint
    state: str | None = None
    footprint_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class ImageRequest:
    """One image-generation request, as the synchronous route and the job store hand it over.

    Attributes:
        prompt, negative_prompt: the texts (checked against the limits by the tasks).
        model: the public model name; ``None`` is the configured diffusion model.
        n: images, image ``k`` with seed ``seed + k``.
        width, height: pixels; ``None``: the model's own side (its card's).
        output_format: ``png``, ``jpeg`` or ``webp``.
        steps: denoising steps; ``None``: the model's own default (its card's).
        guidance: the classifier-free guidance scale.
        seed: the seed of the first image.
        scheduler: ``default`` (the checkpoint's own) or a name of ``serving.limits``' schedulers.
    """

    prompt: str
    model: str | None = None
    n: int = 1
    width: int | None = None
    height: int | None = None
    output_format: str = "png"
    negative_prompt: str = ""
    steps: int | None = None
    guidance: float = DEFAULT_LIMITS.image_generation.default_guidance
    seed: int = 0
    scheduler: str = "default"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (what a job stores)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageRequest:
        """The request a job stored; fields it lacks take their defaults, unknown ones are ignored."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class Embeddings:
    """Unit-length vectors (float32 [n, d]) and the tokens the encoder saw."""

    vectors: np.ndarray
    tokens: int


class OpenAITasks:
    """The tasks behind the OpenAI-compatible routes.

    Args:
        service: admission and the Triton backend.
        cards: model cards (what each model is and allows).
        limits: request limits.
    """

    def __init__(
        self, service: InferenceService, cards: ModelCards, limits: RequestLimits = DEFAULT_LIMITS
    ) -> None:
        self.service = service
        self.cards = cards
        self.limits = limits
        self.pace = GenerationPace()

    # -- models -----------------------------------------------------------------------------

    async def models(self, ctx: RequestContext) -> list[PublicModel]:
        """What the caller can call: READY, in scope, not a pipeline step; aliases of those too."""
        settings = self.service.settings
        index = await self.service.backend.repository_index(
            timeout_s=settings.triton_health_timeout_s * 4
        )
        principal = ctx.principal
        listed: dict[str, PublicModel] = {}
        for entry in index:
            name = str(entry.get("name", ""))
            if (
                entry.get("state") != "READY"
                or name in listed
                or principal is None
                or not principal.allows(name)
            ):
                continue
            card = await self.cards.get(name)
            if not card.internal:
                listed[name] = PublicModel(name, card.created, card.task)
        residency = self.service.admission.residency
        if residency is not None:
            # Not loaded yet, but a request loads them: listed too, with their state and footprint.
            for entry in index:
                name = str(entry.get("name", ""))
                if name in listed or principal is None or not principal.allows(name):
                    continue
                held = residency.state(name)
                if held is not None and not residency.table.entries[name].held_by:
                    listed[name] = PublicModel(name, 0, None)
            for name, model in list(listed.items()):
                held = residency.state(name)
                if held is not None:
                    listed[name] = replace(
                        model, state=held.state, footprint_bytes=held.footprint_bytes
                    )
        for alias, target in settings.model_aliases.items():
            if target in listed and alias not in listed:
                listed[alias] = replace(listed[target], id=alias)
        return sorted(listed.values(), key=lambda m: m.id)

    async def model(self, ctx: RequestContext, model: str) -> PublicModel:
        """One listed model.

        Raises:
            ModelNotFound: not listed for this caller (unknown, out of scope, not ready or internal).
        """
        for entry in await self.models(ctx):
            if entry.id == model:
                return entry
        raise ModelNotFound(
            model, f"model '{model}' does not exist or this credential cannot use it"
        )

    async def _card(
        self, ctx: RequestContext, model: str, task: Task, default: str
    ) -> tuple[str, ModelCard]:
        """The Triton model behind ``model`` and its card, checked to serve ``task`` for this caller.

        The name is checked, then the scope, then that Triton serves it, before its card is read:
        an unknown name makes no card-cache entry.
        """
        admission = self.service.admission
        triton_model = admission.check_scope(ctx, model)
        await admission.known(model, triton_model)
        card = await self.cards.get(triton_model)
        # An entry built before cards existed has none: the configured model keeps working.
        if card.task is not task and not (card.task is None and triton_model == default):
            raise ModelNotFound(
                model, f"model '{model}' does not serve {task.value} (try '{default}')"
            )
        return triton_model, card

    # -- embeddings --------------------------------------------------------------------------

    def _tensors(self, inputs: Sequence[str] | Sequence[Sequence[int]], size: int) -> list[Tensor]:
        """``inputs`` checked and split into chunks of ``size``, as TEXT or TOKEN_IDS tensors."""
        limits = self.limits.embeddings
        if not inputs:
            raise BadRequest("input must hold at least one string or token array", field="input")
        if len(inputs) > limits.max_inputs:
            raise BadRequest(
                f"input holds {len(inputs)} items; at most {limits.max_inputs} per request",
                field="input",
            )
        if all(isinstance(item, str) for item in inputs):
            encoded = [
                _text(item, index, limits.max_text_chars, limits.max_text_bytes)  # type: ignore[arg-type]
                for index, item in enumerate(inputs)
            ]
            return [
                Tensor("TEXT", np.array([[t] for t in encoded[i : i + size]], dtype=np.object_))
                for i in range(0, len(encoded), size)
            ]
        rows = [_token_row(item, index, limits.max_token_ids) for index, item in enumerate(inputs)]  # type: ignore[arg-type]
        tensors = []
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            padded = np.full(
                (len(chunk), max(len(r) for r in chunk)), -1, dtype=np.int64
            )  # -1: the model's padding
            for row, ids in enumerate(chunk):
                padded[row, : len(ids)] = ids
            tensors.append(Tensor("TOKEN_IDS", padded))
        return tensors

    async def embed(
        self,
        ctx: RequestContext,
        model: str,
        inputs: Sequence[str] | Sequence[Sequence[int]],
        dimensions: int | None = None,
    ) -> Embeddings:
        """Embeddings of strings or token arrays, in order.

        The inputs travel in chunks of the model's ``max_batch_size`` (its config's), at most
        ``batches_in_flight`` of them in Triton at once, and come back in the order they were sent.

        Raises:
            BadRequest: a malformed input (``input.N``), or ``dimensions`` outside 1..the model's length.
            InferenceInputError: the model refused an input (``input.N`` where the model names its row).
            ModelNotFound: no such model, or not an embedding model.
        """
        settings = self.service.settings
        triton_model, card = await self._card(ctx, model, Task.EMBEDDINGS, settings.embedding_model)
        if dimensions is not None:
            _check_dimensions(dimensions, card.dimensions, model)
        size = await self.cards.max_batch_size(triton_model) or self.limits.embeddings.batch_size
        chunks = self._tensors(inputs, size)
        # The tokenizer's own count; entries built before TOKENS existed report none (usage 0 then).
        counted = "TOKENS" in await self.cards.outputs(triton_model)

        def refused(chunk: int, exc: GatewayError) -> GatewayError:
            if not isinstance(exc, InferenceInputError):
                return exc
            row = token_row_of(exc.detail)
            if row is None:
                return InferenceInputError(
                    f"input was refused by model '{model}': {exc.detail}", field="input"
                )
            index = chunk * size + row
            return InferenceInputError(
                f"input[{index}] was refused by model '{model}': {exc.detail}",
                field=f"input.{index}",
            )

        outputs = await self._run(
            ctx,
            [[t] for t in chunks],
            ["EMBEDDING", "TOKENS"] if counted else ["EMBEDDING"],
            self.service.admission.admit(ctx, triton_model),
            concurrency=self.limits.embeddings.batches_in_flight,
            relabel=refused,
        )
        vectors = np.concatenate([o["EMBEDDING"] for o in outputs]).astype(np.float32, copy=False)
        tokens = int(sum(int(o["TOKENS"].sum()) for o in outputs)) if counted else 0
        ctx.usage.inputs, ctx.usage.tokens = len(vectors), tokens
        if dimensions is not None and dimensions != vectors.shape[1]:
            _check_dimensions(
                dimensions, vectors.shape[1], model
            )  # a card that did not say its length
            vectors = vectors[:, :dimensions]
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return Embeddings(vectors, tokens)

    async def _run(
        self,
        ctx: RequestContext,
        requests: Sequence[Sequence[Tensor]],
        outputs: Sequence[str],
        admission: AbstractAsyncContextManager[Ticket],
        *,
        concurrency: int = 0,
        relabel: Callable[[int, GatewayError], GatewayError] | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """Run several requests of one client request concurrently, under one admission and one deadline.

        Args:
            concurrency: at most this many in Triton at once (0: all of them).
            relabel: turns a failure of request ``i`` into the answer (e.g. naming the input at fault).

        Returns:
            The outputs of each request, in the order of ``requests``.
        """
        service = self.service
        gate = asyncio.Semaphore(concurrency or max(1, len(requests)))

        async def one(
            index: int, inputs: Sequence[Tensor], ticket: Ticket
        ) -> dict[str, np.ndarray]:
            async with gate:
                route = service.traffic.route(ticket.model)
                try:
                    return await service.routed(
                        ticket.model,
                        route,
                        service.backend.infer(
                            route.model,
                            inputs,
                            outputs,
                            timeout_s=ticket.remaining_s(),
                            version=route.version,
                            priority=ticket.priority,
                        ),
                    )
                except GatewayError as exc:
                    if relabel is None:
                        raise
                    raise relabel(index, exc) from exc

        async with admission as ticket:
            with ctx.stages.stage("upstream"):
                try:
                    async with asyncio.TaskGroup() as group:  # one failure cancels the others
                        tasks = [
                            group.create_task(one(index, inputs, ticket))
                            for index, inputs in enumerate(requests)
                        ]
                except ExceptionGroup as failed:
                    raise failed.exceptions[
                        0
                    ] from None  # the first failure is the answer; the rest were cancelled
        return [task.result() for task in tasks]

    # -- images ------------------------------------------------------------------------------

    def _image_requests(self, request: ImageRequest) -> list[list[Tensor]]:
        """``request`` checked against the limits, as one Triton request per image.

        Raises:
            BadRequest: a parameter out of range (the field is named).
        """
        limits = self.limits.image_generation
        n, seed = request.n, request.seed
        # Unresolved (None) sides and steps are checked as the platform's defaults; resolve_image fills them.
        width = limits.default_side if request.width is None else request.width
        height = limits.default_side if request.height is None else request.height
        steps = limits.default_steps if request.steps is None else request.steps
        if not request.prompt.strip():
            raise BadRequest("prompt must not be empty", field="prompt")
        if not 1 <= n <= limits.max_images:
            raise BadRequest(f"n must be between 1 and {limits.max_images}", field="n")
        for name, side in (("width", width), ("height", height)):
            problem = limits.side_problem(name, side)
            if problem is not None:
                raise BadRequest(problem, field="size")
        if not limits.min_steps <= steps <= limits.max_steps:
            raise BadRequest(
                f"steps must be between {limits.min_steps} and {limits.max_steps}", field="steps"
            )
        guidance = request.guidance
        if not (math.isfinite(guidance) and limits.min_guidance <= guidance <= limits.max_guidance):
            raise BadRequest(
                f"guidance_scale must be between {limits.min_guidance:g} and {limits.max_guidance:g}",
                field="guidance_scale",
            )
        if not limits.min_seed <= seed <= limits.max_seed - (n - 1):
            raise BadRequest(
                f"seed must be between {limits.min_seed} and {limits.max_seed - (n - 1)}",
                field="seed",
            )
        scheduler_problem = limits.scheduler_problem(request.scheduler)
        if scheduler_problem is not None:
            raise BadRequest(scheduler_problem, field="scheduler")
        if request.output_format not in IMAGE_FORMATS:
            raise BadRequest(
                f"output_format must be one of {', '.join(IMAGE_FORMATS)}", field="output_format"
            )
        texts = {
            name: _text(
                value,
                0,
                limits.max_prompt_chars,
                limits.max_prompt_bytes,
                field=name,
                empty_ok=True,
            )
            for name, value in (
                ("prompt", request.prompt),
                ("negative_prompt", request.negative_prompt),
            )
        }
        # One request per image, each of batch 1 ([1, 1] per input) and always with every input: the
        # pipeline's dynamic batcher merges concurrent requests (these n and other clients') into one
        # denoising loop, and it merges only requests that send the same inputs.
        return [
            [
                Tensor("PROMPT", np.array([[texts["prompt"]]], dtype=np.object_)),
                Tensor("NEGATIVE_PROMPT", np.array([[texts["negative_prompt"]]], dtype=np.object_)),
                Tensor("STEPS", np.array([[steps]], dtype=np.int32)),
                Tensor("GUIDANCE", np.array([[guidance]], dtype=np.float32)),
                Tensor("HEIGHT", np.array([[height]], dtype=np.int32)),
                Tensor("WIDTH", np.array([[width]], dtype=np.int32)),
                Tensor("SEED", np.array([[seed + k]], dtype=np.int64)),
                Tensor("SCHEDULER", np.array([[request.scheduler.encode()]], dtype=np.object_)),
            ]
            for k in range(n)
        ]

    async def image_model(self, ctx: RequestContext, request: ImageRequest) -> str:
        """The Triton model ``request`` runs on, after checking the request and the caller's scope.

        Raises:
            BadRequest: a parameter out of range (the field is named).
            PermissionDenied: the model is out of the caller's scope.
            ModelNotFound: no such model, or not an image-generation model.
        """
        return (await self.resolve_image(ctx, request))[0]

    async def resolve_image(
        self, ctx: RequestContext, request: ImageRequest
    ) -> tuple[str, ImageRequest]:
        """The Triton model ``request`` runs on and ``request`` with the model's own defaults filled in.

        A size or step count the request leaves out is the model's (its card's ``limit_default_*``:
        64 pixels for the tiny default model, 512 for SD 1.5), else the platform's.

        Raises:
            BadRequest: a parameter out of range (the field is named).
            PermissionDenied: the model is out of the caller's scope.
            ModelNotFound: no such model, or not an image-generation model.
        """
        self._image_requests(request)  # what the caller named, before anything is looked up
        default = self.service.settings.image_generation_model
        triton_model, card = await self._card(
            ctx, request.model or default, Task.IMAGE_GENERATION, default
        )
        limits = self.limits.image_generation
        side = card.image_side or limits.default_side
        resolved = replace(
            request,
            width=request.width or side,
            height=request.height or side,
            steps=request.steps or card.image_steps or limits.default_steps,
        )
        self._image_requests(resolved)
        return triton_model, resolved

    async def generate_images(self, ctx: RequestContext, request: ImageRequest) -> list[bytes]:
        """``request.n`` encoded images for ``request.prompt`` (seeds ``seed``..``seed + n - 1``), now.

        Raises:
            BadRequest: a parameter out of range (the field is named).
            ModelNotFound: no such model, or not an image-generation model.
            RateLimited, Overloaded: see :meth:`gateway.tenancy.admission.AdmissionControl.admit`.
        """
        triton_model, request = await self.resolve_image(ctx, request)
        return await self._images(ctx, request, self.service.admission.admit(ctx, triton_model))

    async def run_image_job(
        self, ctx: RequestContext, triton_model: str, request: ImageRequest, timeout_s: float
    ) -> list[bytes]:
        """Run an image-generation job that passed admission when it was submitted.

        It takes only the in-flight slot (the tier's share) here, with the job's own deadline,
        which travels to Triton as each request's timeout.

        Raises:
            Overloaded: the tier's share of the model is taken (the job should wait and retry).
            GatewayError: as :meth:`generate_images` once admitted.
        """
        return await self._images(
            ctx, request, self.service.admission.slot(ctx, triton_model, timeout_s)
        )

    def runs_long(self, triton_model: str, request: ImageRequest) -> bool:
        """Whether ``request`` (resolved) is estimated to take longer than ``image_async_after_s``
        (:mod:`gateway.observe.generation_pace`); ``False`` while there is no estimate yet."""
        estimate = self.pace.estimate_s(triton_model, _work(request))
        return estimate is not None and estimate > self.service.settings.image_async_after_s

    async def _images(
        self,
        ctx: RequestContext,
        request: ImageRequest,
        admission: AbstractAsyncContextManager[Ticket],
    ) -> list[bytes]:
        requests = self._image_requests(request)
        started = time.monotonic()
        try:
            outputs = await self._run(ctx, requests, ["IMAGE"], admission)
        except UpstreamTimeout:
            if ctx.model is not None:  # the time it had is a lower bound of the time it needs
                self.pace.observe(ctx.model, _work(request), time.monotonic() - started)
            raise
        if ctx.model is not None:
            self.pace.observe(ctx.model, _work(request), time.monotonic() - started)
        ctx.usage.images = request.n
        # Encoding is CPU work: keep it off the event loop. IMAGE is [1, height, width, 3].
        return [
            await asyncio.to_thread(_encode_image, o["IMAGE"][0], request.output_format)
            for o in outputs
        ]


def _work(request: ImageRequest) -> float:
    limits = DEFAULT_LIMITS.image_generation
    side = limits.default_side
    return generation_work(
        request.n,
        request.steps or limits.default_steps,
        request.width or side,
        request.height or side,
    )


def _text(
    value: str,
    index: int,
    max_chars: int,
    max_bytes: int,
    *,
    field: str = "",
    empty_ok: bool = False,
) -> bytes:
    where = field or f"input.{index}"
    shown = field or f"input[{index}]"
    if not value and not empty_ok:
        raise BadRequest(f"{shown} is empty", field=where)
    if len(value) > max_chars:
        raise BadRequest(f"{shown} is {len(value)} characters; at most {max_chars}", field=where)
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800") is not Unicode text
        raise BadRequest(
            f"{shown} is not valid Unicode text (a lone surrogate at character {exc.start})",
            field=where,
        ) from exc
    if len(data) > max_bytes:
        raise BadRequest(f"{shown} is {len(data)} UTF-8 bytes; at most {max_bytes}", field=where)
    return data


def _check_dimensions(dimensions: int, length: int, model: str) -> None:
    """Refuse ``dimensions`` outside 1..``length`` (``length`` 0: the card does not say; checked later)."""
    if dimensions < 1 or (length and dimensions > length):
        raise BadRequest(
            f"dimensions={dimensions} is not available for model '{model}': it returns "
            f"{length or 'fixed-length'}-dimensional vectors; ask for 1 to {length or 'that many'}",
            field="dimensions",
        )


def _token_row(ids: Sequence[int], index: int, max_ids: int) -> list[int]:
    if isinstance(ids, str) or not ids:
        raise BadRequest(
            f"input[{index}] must be a non-empty array of token ids (or every item a string)",
            field=f"input.{index}",
        )
    if len(ids) > max_ids:
        raise BadRequest(
            f"input[{index}] holds {len(ids)} token ids; at most {max_ids}", field=f"input.{index}"
        )
    if any(type(i) is not int or i < 0 or i > 2**62 for i in ids):
        raise BadRequest(
            f"input[{index}] must hold non-negative integer token ids", field=f"input.{index}"
        )
    return list(ids)


def _encode_image(image: np.ndarray, output_format: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(
        buffer, format=IMAGE_FORMATS[output_format][0]
    )
    return buffer.getvalue()
