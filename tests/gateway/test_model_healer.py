"""The circuit breaker and the healer as units (an in-memory backend; the real thing is in
tests/reliability/test_rel_stub_killed.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.backends.model_breaker import Breakers
from gateway.backends.model_healer import ModelHealer
from gateway.backends.triton import translate_error
from gateway.errors import (
    InferenceInputError,
    ModelUnhealthy,
    Overloaded,
    UpstreamError,
    UpstreamUnavailable,
)
from tests.support.fake_clock import FakeClock

CONFIG = {
    "name": "m",
    "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["1"]}],
}


def _dead(model: str) -> ModelUnhealthy:
    return ModelUnhealthy("gone", failed_model=model, retry_after_s=1)


def test_a_dead_stub_opens_the_breaker_at_once_and_names_the_step_to_reload() -> None:
    breakers = Breakers(failures=3)
    trip = breakers.failure("text_embedding", _dead("text_tokenizer"))
    assert trip is not None and (trip.model, trip.target) == ("text_embedding", "text_tokenizer")
    with pytest.raises(ModelUnhealthy) as refused:
        breakers.check("text_embedding")
    assert refused.value.headers["Retry-After"] == "1"
    breakers.check("other")  # other models are not touched
    assert (
        breakers.failure("text_embedding", _dead("text_tokenizer")) is None
    )  # already open: one trip


def test_internal_errors_open_it_only_in_a_row_and_client_faults_never() -> None:
    breakers = Breakers(failures=3)
    for exc in (
        InferenceInputError("bad"),
        Overloaded("full", retry_after_s=1),
        UpstreamUnavailable("x", retry_after_s=1),
    ):
        assert breakers.failure("m", exc) is None
    assert breakers.failure("m", UpstreamError("boom")) is None
    assert breakers.failure("m", UpstreamError("boom")) is None
    breakers.success("m")  # the run ends
    assert breakers.failure("m", UpstreamError("boom")) is None
    assert breakers.failure("m", UpstreamError("boom")) is None
    trip = breakers.failure("m", UpstreamError("boom"))
    assert trip is not None and trip.target == "m"
    assert breakers.is_open("m")


def test_retry_after_follows_the_next_attempt_and_close_says_how_long() -> None:
    clock = FakeClock(100.0)
    breakers = Breakers(failures=1, clock=clock)
    breakers.failure("m", UpstreamError("boom"))
    breakers.retry_at("m", clock.now + 7.2)
    with pytest.raises(ModelUnhealthy) as refused:
        breakers.check("m")
    assert refused.value.headers["Retry-After"] == "8"
    clock.now += 5
    assert breakers.close("m") == 5
    breakers.check("m")


def test_the_stub_message_translates_to_model_unhealthy_naming_the_instance_model() -> None:
    from tritonclient.utils import InferenceServerException

    exc = translate_error(
        InferenceServerException("Stub process 'text_tokenizer_0_1' is not healthy.", status="500"),
        "text_embedding",
    )
    assert isinstance(exc, ModelUnhealthy) and exc.failed_model == "text_tokenizer"
    other = translate_error(InferenceServerException("something broke", status="500"), "m")
    assert type(other) is UpstreamError


class HealingBackend:
    """Loads fail ``failing_loads`` times, then the model answers."""

    def __init__(self, failing_loads: int) -> None:
        self.failing_loads = failing_loads
        self.loads: list[str] = []
        self.healthy = False

    async def reload_model(self, model: str, *, timeout_s: float) -> None:
        self.loads.append(model)
        if len(self.loads) <= self.failing_loads:
            raise UpstreamError("load failed")
        self.healthy = True

    async def model_config(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]:
        return CONFIG

    async def infer(
        self, model: str, inputs: Any, outputs: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        if not self.healthy:
            raise UpstreamError("still broken")
        return {}


async def test_the_healer_reloads_the_failed_model_with_backoff_then_closes_the_breaker() -> None:
    backend = HealingBackend(failing_loads=2)
    registry = CollectorRegistry()
    healer = ModelHealer(
        backend,  # type: ignore[arg-type]
        Breakers(),
        registry,
        first_backoff_s=0.01,
        max_backoff_s=0.02,
    )
    healer.observe("text_embedding", _dead("text_tokenizer"))
    healer.observe(
        "text_embedding_fp16", _dead("text_tokenizer")
    )  # a second model waiting on the same step
    with pytest.raises(ModelUnhealthy):
        healer.check("text_embedding")
    for _ in range(500):  # bounded: the healer's own back-off is 10-20 ms here
        if not healer.breakers.open_models():
            break
        await asyncio.sleep(0.01)
    assert healer.breakers.open_models() == []
    assert backend.loads == ["text_tokenizer"] * 3  # one target, reloaded until it took
    assert (
        registry.get_sample_value(
            "gateway_model_reloads_total", {"model": "text_tokenizer", "outcome": "failed"}
        )
        == 2
    )
    assert (
        registry.get_sample_value(
            "gateway_model_reloads_total", {"model": "text_tokenizer", "outcome": "ok"}
        )
        == 1
    )
    assert registry.get_sample_value("gateway_model_breaker_open", {"model": "text_embedding"}) == 0
    healer.check("text_embedding")
    await healer.close()


async def test_a_canarys_errors_are_the_rollouts_to_judge_but_a_dead_worker_still_opens_the_breaker() -> (
    None
):
    # A reload during a canary re-applies the version set it read and races the rollback: a
    # promotion test once saw the failing candidate serve again after it was rolled back.
    backend = HealingBackend(failing_loads=0)
    rollout = {"m"}
    healer = ModelHealer(
        backend,
        Breakers(failures=1),
        CollectorRegistry(),  # type: ignore[arg-type]
        first_backoff_s=0.01,
        under_rollout=rollout.__contains__,
    )
    for _ in range(5):
        healer.observe("m", UpstreamError("the candidate raised"))
    healer.check("m")
    assert backend.loads == []
    healer.observe("m", _dead("m"))
    with pytest.raises(ModelUnhealthy):
        healer.check("m")
    healer.observe("other", UpstreamError("broke"))  # a model no rollout splits: counted as before
    with pytest.raises(ModelUnhealthy):
        healer.check("other")
    await healer.close()
