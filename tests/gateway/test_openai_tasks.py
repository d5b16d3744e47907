"""Unit tests of the OpenAI tasks on an in-memory backend: input checks, model cards, dimensions."""

from __future__ import annotations

import numpy as np
import pytest

from gateway import errors
from gateway.context import Principal, RequestContext
from gateway.model_cards import ModelCards
from gateway.openai_tasks import OpenAITasks
from gateway.ratelimit import InProcessRateLimiter
from gateway.service import InferenceService
from gateway.settings import GatewaySettings
from gateway.stats import LatencyTracker
from gateway.tiers import TierLimit
from serving.model_card import ModelCard, Task

CARDS = {
    "text_embedding": ModelCard("text_embedding", task=Task.EMBEDDINGS, dimensions=4),
    "matryoshka": ModelCard("matryoshka", task=Task.EMBEDDINGS, dimensions=4, matryoshka=(2,)),
    "resnet50": ModelCard("resnet50"),
    "text_tokenizer": ModelCard("text_tokenizer", internal=True),
}


class Backend:
    """Answers like the text_embedding ensemble: one unit vector and a token count per input."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[int, ...]]]] = []
        self.scheduling: list[tuple[float, int]] = []

    async def model_config(self, model, *, timeout_s, version=""):  # type: ignore[no-untyped-def]
        if model not in CARDS:
            raise errors.ModelNotFound(model)
        return {"name": model, "output": [{"name": "EMBEDDING"}, {"name": "TOKENS"}],
                "parameters": {k: {"string_value": v} for k, v in CARDS[model].parameters().items()}}

    async def repository_index(self, *, timeout_s):  # type: ignore[no-untyped-def]
        return [{"name": name, "state": "READY", "version": "1"} for name in CARDS]

    async def infer(self, model, inputs, outputs=None, *, timeout_s, version="", priority=0):  # type: ignore[no-untyped-def]
        self.calls.append((inputs[0].name, [tuple(t.data.shape) for t in inputs]))
        self.scheduling.append((timeout_s, priority))
        n = inputs[0].data.shape[0]
        vectors = np.tile(np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32), (n, 1))
        return {"EMBEDDING": vectors, "TOKENS": np.full((n, 1), 3, dtype=np.int64)}


def _tasks() -> tuple[OpenAITasks, Backend]:
    settings = GatewaySettings(tier_limits={"t": TierLimit(per_minute=6000, burst=100)}, default_tier="t",
                               model_aliases={"minilm": "text_embedding"})  # type: ignore[arg-type]
    backend = Backend()
    service = InferenceService(settings, backend, InProcessRateLimiter(), LatencyTracker())  # type: ignore[arg-type]
    return OpenAITasks(service, ModelCards(backend, timeout_s=1)), backend  # type: ignore[arg-type]


def _ctx(scopes: frozenset[str] = frozenset({"*"})) -> RequestContext:
    return RequestContext(request_id="r", principal=Principal("key:x", scopes, "t", "api_key"))


async def test_inputs_are_checked_and_split_into_encoder_batches() -> None:
    tasks, backend = _tasks()
    with pytest.raises(errors.BadRequest) as empty:
        await tasks.embed(_ctx(), "text_embedding", ["ok", ""])
    assert empty.value.field == "input.1"
    with pytest.raises(errors.BadRequest) as surrogate:
        await tasks.embed(_ctx(), "text_embedding", ["\ud800"])
    assert surrogate.value.field == "input.0"
    result = await tasks.embed(_ctx(), "text_embedding", [f"text {i}" for i in range(40)])
    assert result.vectors.shape == (40, 4) and result.tokens == 120
    assert [shape for _, shapes in backend.calls for shape in shapes] == [(32, 1), (8, 1)]
    # Every chunk carries the tier's Triton priority and what is left of the request's one deadline.
    deadline = tasks.service.settings.upstream_timeout_s
    assert [p for _, p in backend.scheduling] == [3, 3] and all(0 < t <= deadline for t, _ in backend.scheduling)
    backend.calls.clear()
    await tasks.embed(_ctx(), "minilm", [[101, 7592, 102], [7592]])
    assert backend.calls == [("TOKEN_IDS", [(2, 3)])]  # one batch, padded with -1 to the longest


async def test_only_embedding_models_embed_and_dimensions_need_matryoshka() -> None:
    tasks, _ = _tasks()
    with pytest.raises(errors.ModelNotFound, match="does not serve embeddings"):
        await tasks.embed(_ctx(), "resnet50", ["x"])
    with pytest.raises(errors.PermissionDenied):
        await tasks.embed(_ctx(frozenset({"resnet50"})), "text_embedding", ["x"])
    with pytest.raises(errors.BadRequest, match="not trained to be shortened") as refused:
        await tasks.embed(_ctx(), "text_embedding", ["x"], dimensions=2)
    assert refused.value.field == "dimensions"
    assert (await tasks.embed(_ctx(), "text_embedding", ["x"], dimensions=4)).vectors.shape == (1, 4)
    short = (await tasks.embed(_ctx(), "matryoshka", ["x"], dimensions=2)).vectors
    assert short.shape == (1, 2) and np.allclose(np.linalg.norm(short, axis=1), 1.0)


async def test_listing_leaves_out_pipeline_steps_and_follows_scopes() -> None:
    tasks, _ = _tasks()
    assert [m.id for m in await tasks.models(_ctx())] == ["matryoshka", "minilm", "resnet50", "text_embedding"]
    assert [m.id for m in await tasks.models(_ctx(frozenset({"resnet50"})))] == ["resnet50"]
    with pytest.raises(errors.ModelNotFound):
        await tasks.model(_ctx(), "text_tokenizer")
