"""Unit tests of the OpenAI tasks on an in-memory backend: input checks, model cards, dimensions."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway import errors
from gateway.backends.model_cards import ModelCards
from gateway.observe.stats import LatencyTracker
from gateway.settings import GatewaySettings
from gateway.tasks.openai import OpenAITasks
from gateway.tasks.service import InferenceService
from gateway.tenancy.context import Principal, RequestContext
from gateway.tenancy.ratelimit import InProcessRateLimiter
from gateway.tenancy.tiers import TierLimit
from serving.model_card import ModelCard, Task

CARDS = {
    "text_embedding": ModelCard("text_embedding", task=Task.EMBEDDINGS, dimensions=4),
    "matryoshka": ModelCard("matryoshka", task=Task.EMBEDDINGS, dimensions=4, matryoshka=(2,)),
    "resnet50": ModelCard("resnet50"),
    "text_tokenizer": ModelCard("text_tokenizer", internal=True),
}


#: the embedding models' ``max_batch_size`` here: not serving.limits' 32, so the split follows the config
BATCH = 16


class Backend:
    """Answers like the text_embedding ensemble: a unit vector (its first value tells the text's number,
    when the text is ``text N``) and a token count per input."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[int, ...]]]] = []
        self.scheduling: list[tuple[float, int]] = []
        self.in_flight = self.most_in_flight = 0
        self.refuse: str | None = None  # the error message of a refused TOKEN_IDS request

    async def model_config(self, model, *, timeout_s, version=""):  # type: ignore[no-untyped-def]
        if model not in CARDS:
            raise errors.ModelNotFound(model)
        return {
            "name": model,
            "output": [{"name": "EMBEDDING"}, {"name": "TOKENS"}],
            "max_batch_size": BATCH,
            "parameters": {k: {"string_value": v} for k, v in CARDS[model].parameters().items()},
        }

    async def repository_index(self, *, timeout_s):  # type: ignore[no-untyped-def]
        return [{"name": name, "state": "READY", "version": "1"} for name in CARDS]

    async def infer(  # type: ignore[no-untyped-def]
        self, model, inputs, outputs=None, *, timeout_s, version="", priority=0
    ):
        self.calls.append((inputs[0].name, [tuple(t.data.shape) for t in inputs]))
        self.scheduling.append((timeout_s, priority))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            data = inputs[0].data
            # Later chunks answer first: the order of the answer must come from the request, not the finish.
            for _ in range(64 - len(self.calls)):
                await asyncio.sleep(0)
            if inputs[0].name == "TOKEN_IDS" and self.refuse is not None:
                raise errors.InferenceInputError(self.refuse)
            n = data.shape[0]
            vectors = np.tile(np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32), (n, 1))
            if inputs[0].name == "TEXT":
                vectors[:, 0] = [
                    float(t[0].split()[-1]) if t[0].startswith(b"text ") else 0.5 for t in data
                ]
            return {"EMBEDDING": vectors, "TOKENS": np.full((n, 1), 3, dtype=np.int64)}
        finally:
            self.in_flight -= 1


def _tasks() -> tuple[OpenAITasks, Backend]:
    settings = GatewaySettings(
        tier_limits={"t": TierLimit(per_minute=6000, burst=100)},
        default_tier="t",
        model_aliases={"minilm": "text_embedding"},
    )  # type: ignore[arg-type]
    backend = Backend()
    service = InferenceService(
        settings,
        backend,  # type: ignore[arg-type]
        InProcessRateLimiter(),
        LatencyTracker(),
    )
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
    assert [shape for _, shapes in backend.calls for shape in shapes] == [
        (BATCH, 1),
        (BATCH, 1),
        (8, 1),
    ]
    # Every chunk carries the tier's Triton priority and what is left of the request's one deadline.
    deadline = tasks.service.settings.upstream_timeout_s
    assert [p for _, p in backend.scheduling] == [3, 3, 3] and all(
        0 < t <= deadline for t, _ in backend.scheduling
    )
    backend.calls.clear()
    await tasks.embed(_ctx(), "minilm", [[101, 7592, 102], [7592]])
    assert backend.calls == [("TOKEN_IDS", [(2, 3)])]  # one batch, padded with -1 to the longest


async def test_the_most_inputs_come_back_in_order_with_a_bounded_number_in_flight() -> None:
    tasks, backend = _tasks()
    limits = tasks.limits.embeddings
    count = limits.max_inputs
    result = await tasks.embed(_ctx(), "text_embedding", [f"text {i}" for i in range(count)])
    assert len(backend.calls) == -(-count // BATCH)
    assert backend.most_in_flight == limits.batches_in_flight < len(backend.calls)
    # Each vector is its own text's: the first value is the text's number.
    assert np.all(np.diff(result.vectors[:, 0]) > 0) and result.vectors.shape == (count, 4)
    with pytest.raises(errors.BadRequest, match=f"at most {count}") as too_many:
        await tasks.embed(_ctx(), "text_embedding", ["x"] * (count + 1))
    assert too_many.value.field == "input"


async def test_a_token_row_the_model_refuses_is_named_as_the_clients_input() -> None:
    tasks, backend = _tasks()
    backend.refuse = (
        "in ensemble 'text_embedding', TOKEN_IDS row 3 holds id 13 at position 0, "
        "the reserved entry"
    )
    with pytest.raises(errors.InferenceInputError) as refused:
        await tasks.embed(_ctx(), "text_embedding", [[2000 + i] for i in range(BATCH * 2)])
    # Row 3 of a chunk: the first chunk to fail is either one; the index is that chunk's row 3.
    assert refused.value.field in ("input.3", f"input.{BATCH + 3}")
    assert refused.value.detail.startswith(
        f"input[{refused.value.field[6:]}] was refused by model 'text_embedding'"
    )
    backend.refuse = "something without a row"
    with pytest.raises(errors.InferenceInputError) as unplaced:
        await tasks.embed(_ctx(), "text_embedding", [[2000]])
    assert unplaced.value.field == "input"


async def test_only_embedding_models_embed_and_dimensions_truncate_and_renormalise() -> None:
    tasks, _ = _tasks()
    with pytest.raises(errors.ModelNotFound, match="does not serve embeddings"):
        await tasks.embed(_ctx(), "resnet50", ["x"])
    with pytest.raises(errors.PermissionDenied):
        await tasks.embed(_ctx(frozenset({"resnet50"})), "text_embedding", ["x"])
    for past in (5, 0, -1):
        with pytest.raises(
            errors.BadRequest, match=f"dimensions={past} .* ask for 1 to 4"
        ) as refused:
            await tasks.embed(_ctx(), "text_embedding", ["x"], dimensions=past)
        assert refused.value.field == "dimensions"
    assert (await tasks.embed(_ctx(), "text_embedding", ["x"], dimensions=4)).vectors.shape == (
        1,
        4,
    )
    for model, length in (("text_embedding", 3), ("text_embedding", 1), ("matryoshka", 2)):
        short = (await tasks.embed(_ctx(), model, ["x"], dimensions=length)).vectors
        assert short.shape == (1, length) and np.allclose(np.linalg.norm(short, axis=1), 1.0)
        assert np.allclose(short, np.full((1, length), 1 / np.sqrt(length)))


async def test_listing_leaves_out_pipeline_steps_and_follows_scopes() -> None:
    tasks, _ = _tasks()
    assert [m.id for m in await tasks.models(_ctx())] == [
        "matryoshka",
        "minilm",
        "resnet50",
        "text_embedding",
    ]
    assert [m.id for m in await tasks.models(_ctx(frozenset({"resnet50"})))] == ["resnet50"]
    with pytest.raises(errors.ModelNotFound):
        await tasks.model(_ctx(), "text_tokenizer")
