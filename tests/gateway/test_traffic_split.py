"""Canary weights: validation and the share each version gets."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from gateway.errors import BadRequest
from gateway.tenancy.traffic import Route, TrafficSplit


def test_unpinned_models_name_no_version() -> None:
    assert TrafficSplit().pick("m") == ""


def test_weights_share_traffic_by_proportion() -> None:
    split = TrafficSplit(random.Random(0))
    split.set("m", {"1": 9, "2": 1})
    counts = Counter(split.pick("m") for _ in range(10_000))
    assert set(counts) == {"1", "2"}
    assert 0.08 < counts["2"] / 10_000 < 0.12
    assert split.snapshot() == {"m": {"1": 0.9, "2": 0.1}}


def test_a_single_version_takes_everything_and_clear_unpins() -> None:
    split = TrafficSplit()
    split.set("m", {"2": 1.0, "1": 0.0})
    assert {split.pick("m") for _ in range(100)} == {"2"}
    assert split.clear("m") and split.pick("m") == ""
    assert not split.clear("m")


@pytest.mark.parametrize(
    "weights",
    [
        {"1": 0},
        {"1": -1, "2": 1},
        {"latest": 1},
        {"1": 1e308},
        {"1": float("inf")},
        {"1": float("nan"), "2": 1},
        {"\u0661": 1},  # ARABIC-INDIC DIGIT ONE: str.isdigit() says yes, Triton says no
        {"0": 1},
        {"9" * 20: 1},
        {str(v): 1 for v in range(1, 18)},
    ],
    ids=[
        "zero",
        "negative",
        "name",
        "huge",
        "inf",
        "nan",
        "unicode-digit",
        "zero-version",
        "int64-overflow",
        "too-many",
    ],
)
def test_bad_weights_are_refused_and_change_nothing(weights: dict[str, float]) -> None:
    split = TrafficSplit()
    split.set("m", {"1": 1})
    with pytest.raises(BadRequest):
        split.set("m", weights)
    assert split.snapshot() == {"m": {"1": 1.0}}


def test_a_share_can_go_to_another_model() -> None:
    """A canary pipeline: ``model:<name>`` sends its share to that model, with no version named."""
    split = TrafficSplit(random.Random(0))
    split.set("ensemble", {"3": 3, "model:ensemble__canary": 1})
    routes = Counter(split.route("ensemble") for _ in range(4_000))
    assert set(routes) == {Route("ensemble", "3"), Route("ensemble__canary", "")}
    assert 0.2 < routes[Route("ensemble__canary", "")] / 4_000 < 0.3
    assert split.snapshot() == {"ensemble": {"3": 0.75, "model:ensemble__canary": 0.25}}
    assert split.route("other") == Route("other", "")


@pytest.mark.parametrize(
    "target", ["model:", "model:stats", "model:a/b", "model:../x", "Model:x", "model: x"]
)
def test_bad_model_targets_are_refused(target: str) -> None:
    with pytest.raises(BadRequest):
        TrafficSplit().set("m", {"1": 1, target: 1})


def test_outcomes_are_counted_per_target_while_weights_are_set() -> None:
    split = TrafficSplit()
    split.observe("m", Route("m", "1"), ok=False)  # unpinned: nothing to watch
    split.set("m", {"1": 1, "2": 1})
    split.observe("m", Route("m", "1"), ok=True)
    split.observe("m", Route("m", "2"), ok=False)
    split.observe("m", Route("m", "2"), ok=True)
    assert asyncio.run(split.outcomes("m")) == {
        "1": {"answered": 1, "failed": 0},
        "2": {"answered": 1, "failed": 1},
    }
    split.clear("m")
    assert asyncio.run(split.outcomes("m")) == {}
