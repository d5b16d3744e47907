"""Unit tests of single functions: limiter math, quantiles, key hashing, error mapping, public API."""

from __future__ import annotations

import asyncio
import sqlite3

import aiohttp
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

import gateway
from gateway import errors
from gateway.app import ERROR_STATUS
from gateway.context import Principal, RequestContext
from gateway.keys import KeyStore, parse_key
from gateway.problems import ProblemRenderer
from gateway.ratelimit import InProcessRateLimiter, gcra
from gateway.service import InferenceService
from gateway.settings import GatewaySettings, TierLimit
from gateway.stats import LATENCY_BUCKETS_S, LatencyTracker, SlidingWindow, quantile
from gateway.triton import RawResponse, translate_error


def test_public_api_is_what_we_mean() -> None:
    assert set(gateway.__all__) == {
        "GatewaySettings",
        "KeyStore",
        "bootstrap_first_key",
        "create_app",
        "run_overhead_benchmark",
        "serve",
    }
    for name in gateway.__all__:
        assert callable(getattr(gateway, name))


# -- GCRA ------------------------------------------------------------------------------------


def test_gcra_admits_the_burst_then_the_sustained_rate() -> None:
    limit = TierLimit(per_minute=60, burst=3)  # one a second
    tat, now, allowed = 0.0, 100.0, []
    for _ in range(5):
        tat, decision = gcra(tat, now, limit)
        allowed.append(decision.allowed)
    assert allowed == [True, True, True, False, False]
    _, refused = gcra(tat, now, limit)
    assert refused.remaining == 0 and refused.retry_after_s == pytest.approx(1.0)
    tat, later = gcra(tat, now + 1.0, limit)  # one interval later, one more fits
    assert later.allowed and later.remaining == 0


def test_gcra_remaining_counts_down() -> None:
    limit = TierLimit(per_minute=600, burst=5)
    tat, remaining = 0.0, []
    for _ in range(5):
        tat, decision = gcra(tat, 50.0, limit)
        remaining.append(decision.remaining)
    assert remaining == [4, 3, 2, 1, 0]
    assert decision.headers()["RateLimit-Policy"] == "600;w=60;burst=5"


async def test_in_process_limiter_keeps_buckets_apart() -> None:
    limiter = InProcessRateLimiter()
    limit = TierLimit(per_minute=1, burst=1)
    assert (await limiter.hit("a:m", limit)).allowed
    assert not (await limiter.hit("a:m", limit)).allowed
    assert (await limiter.hit("a:other", limit)).allowed
    refused = await limiter.hit("a:m", limit)
    assert refused.headers()["Retry-After"] == "60"


# -- quantiles -------------------------------------------------------------------------------


def test_nearest_rank_quantiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 1.0) == 100.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_sliding_window_forgets_old_samples() -> None:
    window = SlidingWindow(window_s=10.0, max_samples=1000)
    for i in range(10):
        window.add(1.0, now=float(i))
    window.add(0.002, now=100.0)
    summary = window.summary(now=100.0)
    assert summary is not None and summary.count == 1 and summary.p99_ms == pytest.approx(2.0)


def test_client_labels_are_capped() -> None:
    tracker = LatencyTracker(max_client_labels=2)
    for client in ("a", "b", "c", "d"):
        tracker.record("m", client, 200, 0.01)
    assert set(tracker.snapshot()["clients"]) == {"a", "b", "_other"}  # type: ignore[arg-type]


def test_buckets_are_fine_enough_for_p99() -> None:
    ratios = [b / a for a, b in zip(LATENCY_BUCKETS_S, LATENCY_BUCKETS_S[1:], strict=False)]
    assert max(ratios) <= 1.26 and LATENCY_BUCKETS_S[0] <= 0.0005 and LATENCY_BUCKETS_S[-1] >= 30


def test_triton_deltas_become_means() -> None:
    tracker = LatencyTracker(window_s=60)
    tracker.update_triton("m", requests=10, queue_ns=10_000_000, compute_ns=50_000_000, success_ns=70_000_000)
    tracker.update_triton(
        "m", requests=20, queue_ns=30_000_000, compute_ns=100_000_000, success_ns=140_000_000
    )
    triton = tracker.snapshot()["models"]["m"]["triton"]  # type: ignore[index]
    assert triton == {"requests": 10, "queue_mean_ms": 2.0, "compute_mean_ms": 5.0, "request_mean_ms": 7.0}


# -- keys ------------------------------------------------------------------------------------


def test_keys_are_hashed_at_rest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = KeyStore(tmp_path / "keys.db")
    key_id, plaintext = store.create("app", ["tiny_linear"], "free")
    assert parse_key(plaintext) == key_id
    raw = sqlite3.connect(tmp_path / "keys.db").execute("SELECT * FROM api_keys").fetchall()
    assert plaintext not in repr(raw) and plaintext.split("_", 2)[2] not in repr(raw)
    record = store.verify(plaintext)
    assert record is not None and record.allows("tiny_linear") and not record.allows("resnet50")
    assert store.verify(plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")) is None
    new = store.rotate(key_id)
    assert store.verify(plaintext) is None and store.verify(new) is not None
    store.revoke(key_id)
    assert store.verify(new) is None
    with pytest.raises(KeyError):
        store.rotate(key_id)


def test_bootstrap_first_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = GatewaySettings(keys_db=tmp_path / "k.db")
    plaintext = gateway.bootstrap_first_key(settings)
    record = KeyStore(settings.keys_db).verify(plaintext)
    assert record is not None and record.scopes == ("*",)


# -- error mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (errors.InferenceInputError("x"), 400),
        (errors.ModelNotFound("m"), 404),
        (errors.ModelNotReady("x", retry_after_s=1), 503),
        (errors.RateLimiterUnavailable("x", retry_after_s=1), 503),
        (errors.Overloaded("x", retry_after_s=1), 429),
        (errors.UpstreamTimeout("x"), 504),
        (errors.PayloadTooLarge("x"), 413),
    ],
)
def test_one_table_maps_every_error(exc: errors.GatewayError, status: int) -> None:
    renderer = ProblemRenderer(ERROR_STATUS)
    code, headers, _ = renderer.render(exc, "/p")
    assert code == status
    if status in (429, 503):
        assert int(headers["Retry-After"]) >= 1


def test_triton_errors_are_translated() -> None:
    unknown = InferenceServerException("Request for unknown model: 'm' is not found", status="400")
    assert isinstance(translate_error(unknown, "m"), errors.ModelNotFound)
    shape = InferenceServerException("unexpected shape for input 'input' for model 'm'", status="400")
    translated = translate_error(shape, "m")
    assert isinstance(translated, errors.InferenceInputError) and translated.field == "inputs.input"
    assert isinstance(
        translate_error(InferenceServerException("boom", status="500"), "m"), errors.UpstreamError
    )
    assert isinstance(translate_error(TimeoutError(), "m"), errors.UpstreamTimeout)
    refused = aiohttp.ClientConnectionError("refused")
    assert isinstance(translate_error(refused, "m"), errors.UpstreamUnavailable)
    # A bug of ours is not a client error.
    assert not isinstance(translate_error(TypeError("x"), "m"), errors.BadRequest)


# -- service with a fake backend -------------------------------------------------------------


class FakeBackend:
    """An in-memory InferenceBackend: answers after ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def infer_raw(self, model, body, headers, *, timeout_s, version=""):  # type: ignore[no-untyped-def]
        await self.release.wait()
        return RawResponse(b"{}", {"content-type": "application/json"})

    async def infer(self, model, inputs, outputs=None, *, timeout_s, version=""):  # type: ignore[no-untyped-def]
        return {"EMBEDDING": np.ones((len(inputs[0].data), 3), dtype=np.float32)}


def _service(**settings: object) -> InferenceService:
    config = GatewaySettings(
        tier_limits={"t": TierLimit(per_minute=6000, burst=100)}, default_tier="t", **settings
    )  # type: ignore[arg-type]
    return InferenceService(config, FakeBackend(), InProcessRateLimiter(), LatencyTracker())  # type: ignore[arg-type]


def _ctx(scopes: frozenset[str] = frozenset({"*"})) -> RequestContext:
    return RequestContext(request_id="r", principal=Principal("key:x", scopes, "t", "api_key"))


async def test_in_flight_bound_refuses_the_extra_request() -> None:
    service = _service(max_in_flight_per_model=2)
    backend = service.backend
    running = [asyncio.create_task(service.infer_raw(_ctx(), "m", b"{}", {})) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(errors.Overloaded):
        await service.infer_raw(_ctx(), "m", b"{}", {})
    backend.release.set()  # type: ignore[attr-defined]
    await asyncio.gather(*running)
    assert service._in_flight["m"] == 0


async def test_scope_is_checked_before_the_limit() -> None:
    service = _service()
    with pytest.raises(errors.PermissionDenied):
        await service.infer_raw(_ctx(frozenset({"a"})), "b", b"{}", {})


async def test_embeddings_validate_input_and_model() -> None:
    service = _service()
    with pytest.raises(errors.BadRequest) as bad:
        await service.embed(_ctx(), "text_embedding", ["ok", ""])
    assert bad.value.field == "input.1"
    with pytest.raises(errors.ModelNotFound):
        await service.embed(_ctx(), "resnet50", ["x"])
    vectors = await service.embed(_ctx(), "text_embedding", ["a", "b"])
    assert len(vectors) == 2 and len(vectors[0]) == 3
