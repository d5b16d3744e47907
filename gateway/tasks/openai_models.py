"""The OpenAI-compatible model listing (``/v1/models``): what a caller can call. Part of
:class:`gateway.tasks.openai.OpenAITasks`.

Triton's READY models in the caller's scope, without internal pipeline steps (their card says
``visibility: internal``), plus configured aliases of listed models; with residency on, the models a
request would load too, each with its state and footprint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.backends.model_cards import ModelCards
from gateway.errors import ModelNotFound
from gateway.tasks.service import InferenceService
from gateway.tenancy.context import RequestContext
from serving.model_card import Task

__all__ = ["ModelListing", "PublicModel"]


@dataclass(frozen=True)
class PublicModel:
    """A model a client can call, as ``/v1/models`` lists it."""

    id: str
    created: int
    task: Task | None
    #: with residency on (:mod:`gateway.backends.residency`): its state and footprint
    state: str | None = None
    footprint_bytes: int | None = None


class ModelListing:
    """The listing of :class:`gateway.tasks.openai.OpenAITasks`, which provides the attributes below."""

    service: InferenceService
    cards: ModelCards

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
