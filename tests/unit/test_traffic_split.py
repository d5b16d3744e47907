"""Canary weights: validation and the share each version gets."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.errors import BadRequest
from gateway.traffic import TrafficSplit


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


@pytest.mark.parametrize("weights", [{"1": 0}, {"1": -1, "2": 1}, {"latest": 1}], ids=["zero", "negative", "name"])
def test_bad_weights_are_refused_and_change_nothing(weights: dict[str, float]) -> None:
    split = TrafficSplit()
    split.set("m", {"1": 1})
    with pytest.raises(BadRequest):
        split.set("m", weights)
    assert split.snapshot() == {"m": {"1": 1.0}}
