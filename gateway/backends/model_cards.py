"""What each served model says about itself to clients (:class:`serving.model_card.ModelCard`),
read from Triton's model configs and cached briefly.

The builders write a card into every entry's config ``parameters`` (task, internal pipeline step,
creation time, embedding length and Matryoshka lengths); this is how the OpenAI routes know which
models to list, which take ``/v1/embeddings``, how long their vectors are and how many inputs one
Triton request may carry (the config's ``max_batch_size``). Only models
Triton knows are cached (a config that cannot be read is not), so the cache is bounded by the
repository, not by what clients type.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from gateway.backends.triton import InferenceBackend
from serving.model_card import ModelCard

__all__ = ["DEFAULT_CARD_TTL_S", "ModelCards"]

DEFAULT_CARD_TTL_S = 10.0


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class ModelCards:
    """Cards of Triton's models, each re-read at most every ``ttl_s`` seconds.

    Args:
        backend: where configs come from.
        timeout_s: deadline of one config read.
        ttl_s: how long a card is trusted (a rebuilt model's new card shows within it).
        clock: monotonic seconds (tests pass their own).
    """

    backend: InferenceBackend
    _: KW_ONLY
    timeout_s: float
    ttl_s: float = DEFAULT_CARD_TTL_S
    clock: Callable[[], float] = time.monotonic
    _cards: dict[str, tuple[float, ModelCard, frozenset[str], int]] = field(
        default_factory=dict, init=False, repr=False
    )

    async def outputs(self, model: str) -> frozenset[str]:
        """The names of ``model``'s outputs (an entry built before an output existed lacks it)."""
        await self.get(model)
        return self._cards[model][2]

    async def max_batch_size(self, model: str) -> int:
        """``model``'s ``max_batch_size`` from its config (0: it does not batch)."""
        await self.get(model)
        return self._cards[model][3]

    async def get(self, model: str) -> ModelCard:
        """The card of ``model``.

        Raises:
            ModelNotFound: Triton does not serve ``model``.
            UpstreamUnavailable, UpstreamTimeout: the config could not be read.
        """
        now = self.clock()
        cached = self._cards.get(model)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        config = await self.backend.model_config(model, timeout_s=self.timeout_s)
        card = ModelCard.from_config({**config, "name": model})
        outputs = frozenset(
            str(o.get("name", "")) for o in config.get("output", []) if isinstance(o, dict)
        )
        try:
            batch = max(0, int(config.get("max_batch_size", 0)))
        except (
            TypeError,
            ValueError,
        ):  # Triton writes an integer; anything else means "no batching"
            batch = 0
        self._cards[model] = (now, card, outputs, batch)
        return card
