"""The model card vocabulary: what builders write into configs is what the gateway reads back."""

from __future__ import annotations

from serving.model_card import ModelCard, Task, internal_parameters


def _as_triton_json(params: dict[str, str]) -> dict[str, object]:
    return {"name": "m", "parameters": {k: {"string_value": v} for k, v in params.items()}}


def test_card_round_trips_through_config_parameters() -> None:
    card = ModelCard(
        "m", task=Task.EMBEDDINGS, created=1764690000, dimensions=768, matryoshka=(256, 64)
    )
    back = ModelCard.from_config(_as_triton_json(card.parameters()))
    assert back == ModelCard(
        "m", task=Task.EMBEDDINGS, created=1764690000, dimensions=768, matryoshka=(64, 256)
    )
    assert (
        back.allows_dimensions(768)
        and back.allows_dimensions(64)
        and not back.allows_dimensions(100)
    )


def test_internal_steps_and_hand_written_entries() -> None:
    assert ModelCard.from_config(_as_triton_json(internal_parameters())).internal
    plain = ModelCard.from_config({"name": "tiny_linear"})
    assert plain == ModelCard("tiny_linear") and not plain.internal and plain.task is None
    odd = ModelCard.from_config(
        _as_triton_json({"task": "chat", "created": "soon", "embedding_dimensions": "-3"})
    )
    assert odd.task is None and odd.created == 0 and odd.dimensions == 0


def test_a_model_without_matryoshka_training_takes_only_its_own_length() -> None:
    card = ModelCard("text_embedding", task=Task.EMBEDDINGS, dimensions=384)
    assert card.allows_dimensions(384) and not card.allows_dimensions(128)
