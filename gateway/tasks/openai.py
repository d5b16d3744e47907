"""The OpenAI-compatible tasks: model listing, embeddings, image generation.

Protocol-neutral like :mod:`gateway.tasks.service` (no FastAPI, no REST models): the routes in
:mod:`gateway.routes.openai` translate HTTP to these calls. Admission (name, scope, rate limits,
in-flight share, deadline and priority: :mod:`gateway.tenancy.admission`) and the Triton backend are the
service's; what a model is and allows comes from its card
(:mod:`gateway.backends.model_cards`); request limits from :mod:`serving.limits`.

- Listing: Triton's READY models in the caller's scope, without internal pipeline steps (their card
  says ``visibility: internal``), plus configured aliases of listed models
  (:mod:`gateway.tasks.openai_models`).
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
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace

import numpy as np

from gateway.backends.model_cards import ModelCards
from gateway.backends.triton import Tensor
from gateway.errors import (
    GatewayError,
    InferenceInputError,
    ModelNotFound,
    UpstreamTimeout,
)
from gateway.observe.generation_pace import GenerationPace
from gateway.tasks.openai_inputs import (
    ImageRequest,
    check_dimensions,
    embedding_tensors,
    encode_image,
    image_requests,
    image_work,
)
from gateway.tasks.openai_models import ModelListing
from gateway.tasks.service import InferenceService
from gateway.tenancy.admission import Ticket
from gateway.tenancy.context import RequestContext
from serving.limits import DEFAULT_LIMITS, RequestLimits
from serving.model_card import ModelCard, Task
from serving.token_ids import token_row_of

__all__ = ["Embeddings", "OpenAITasks"]


@dataclass(frozen=True)
class Embeddings:
    """Unit-length vectors (float32 [n, d]) and the tokens the encoder saw."""

    vectors: np.ndarray
    tokens: int


class OpenAITasks(ModelListing):
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
            check_dimensions(dimensions, card.dimensions, model)
        size = await self.cards.max_batch_size(triton_model) or self.limits.embeddings.batch_size
        chunks = embedding_tensors(inputs, size, self.limits.embeddings)
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
            check_dimensions(
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
                    return await service.infer_routed(route, ticket, inputs, outputs)
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
        image_requests(
            request, self.limits.image_generation
        )  # what the caller named, before anything is looked up
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
        image_requests(resolved, self.limits.image_generation)
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
        estimate = self.pace.estimate_s(triton_model, image_work(request))
        return estimate is not None and estimate > self.service.settings.image_async_after_s

    async def _images(
        self,
        ctx: RequestContext,
        request: ImageRequest,
        admission: AbstractAsyncContextManager[Ticket],
    ) -> list[bytes]:
        requests = image_requests(request, self.limits.image_generation)
        started = time.monotonic()
        try:
            outputs = await self._run(ctx, requests, ["IMAGE"], admission)
        except UpstreamTimeout:
            if ctx.model is not None:  # the time it had is a lower bound of the time it needs
                self.pace.observe(ctx.model, image_work(request), time.monotonic() - started)
            raise
        if ctx.model is not None:
            self.pace.observe(ctx.model, image_work(request), time.monotonic() - started)
        ctx.usage.images = request.n
        # Encoding is CPU work: keep it off the event loop. IMAGE is [1, height, width, 3].
        return [
            await asyncio.to_thread(encode_image, o["IMAGE"][0], request.output_format)
            for o in outputs
        ]
