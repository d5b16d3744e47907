"""Unit tests of single functions: limiter math, quantiles, key hashing, error mapping, public API."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import aiohttp
import numpy as np
import pytest
from prometheus_client import generate_latest
from tritonclient.utils import InferenceServerException

import gateway
from gateway import errors
from gateway.app import ERROR_SHAPES, ERROR_STATUS
from gateway.backends.catalog import ModelCatalog
from gateway.backends.triton import RawResponse, translate_error
from gateway.http.problems import ErrorReport, ProblemRenderer
from gateway.observe.metrics import LATENCY_BUCKETS_S
from gateway.observe.stats import LatencyTracker
from gateway.protocol.kserve import InferRequest, RestBody
from gateway.settings import GatewaySettings
from gateway.tasks.service import InferenceService
from gateway.tenancy.context import Principal, RequestContext
from gateway.tenancy.keys import parse_key
from gateway.tenancy.keys_sqlite import SqliteKeyStore
from gateway.tenancy.ratelimit import InProcessRateLimiter, gcra
from gateway.tenancy.tiers import RateLimit, TierLimit


def test_public_api_is_what_we_mean() -> None:
    assert set(gateway.__all__) == {
        "GatewaySettings",
        "KeyStore",
        "bootstrap_first_key",
        "open_key_store",
        "create_app",
        "serve",
    }
    for name in gateway.__all__:
        assert callable(getattr(gateway, name))


# -- GCRA ------------------------------------------------------------------------------------


def test_gcra_admits_the_burst_then_the_sustained_rate() -> None:
    limit = RateLimit(per_minute=60, burst=3)  # one a second
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
    limit = RateLimit(per_minute=600, burst=5)
    tat, remaining = 0.0, []
    for _ in range(5):
        tat, decision = gcra(tat, 50.0, limit)
        remaining.append(decision.remaining)
    assert remaining == [4, 3, 2, 1, 0]
    assert decision.headers()["RateLimit-Policy"] == "600;w=60;burst=5"


async def test_in_process_limiter_keeps_buckets_apart() -> None:
    limiter = InProcessRateLimiter()
    limit = RateLimit(per_minute=1, burst=1)
    assert (await limiter.hit("a:m", limit)).allowed
    assert not (await limiter.hit("a:m", limit)).allowed
    assert (await limiter.hit("a:other", limit)).allowed
    refused = await limiter.hit("a:m", limit)
    assert refused.headers()["Retry-After"] == "60"


# -- Prometheus buckets ----------------------------------------------------------------------


def test_buckets_are_fine_enough_for_p99() -> None:
    ratios = [b / a for a, b in zip(LATENCY_BUCKETS_S, LATENCY_BUCKETS_S[1:], strict=False)]
    assert max(ratios) <= 1.26 and LATENCY_BUCKETS_S[0] <= 0.0005 and LATENCY_BUCKETS_S[-1] >= 30


# -- keys ------------------------------------------------------------------------------------


def test_keys_are_hashed_at_rest(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = SqliteKeyStore(tmp_path / "keys.db")
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
    record = SqliteKeyStore(settings.keys_db).verify(plaintext)
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
        (errors.CapacityReserved("x", retry_after_s=1), 503),
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


def test_each_api_gets_its_own_error_shape_with_the_same_status_and_headers() -> None:
    renderer = ProblemRenderer(ERROR_STATUS, ERROR_SHAPES)
    exc = errors.RateLimited("slow down", retry_after_s=2, headers={"RateLimit-Remaining": "0"})
    for path, shape in (
        ("/v2/models/m/infer", "kserve"),
        ("/v2", "kserve"),
        ("/v1/embeddings", "openai"),
        ("/v1/models/m", "openai"),
        ("/v1/images/jobs/x", "openai"),
        ("/v1/images/files/x", "problem"),
        ("/v1/classify", "problem"),
        ("/v1/modelsx", "problem"),
        ("/v2x", "problem"),
    ):
        status, headers, raw = renderer.render(exc, path)
        body = json.loads(raw)
        assert (
            status == 429
            and headers["Retry-After"] == "2"
            and headers["RateLimit-Remaining"] == "0"
        ), path
        if shape == "kserve":
            assert body == {"error": "slow down"}
        elif shape == "openai":
            assert body == {
                "error": {
                    "message": "slow down",
                    "type": "rate_limit_error",
                    "param": None,
                    "code": "rate_limited",
                }
            }
        else:
            assert (
                body["detail"] == "slow down"
                and headers["content-type"] == "application/problem+json"
            ), path
    # Asked for explicitly, problem+json is served on any path.
    _, headers, _ = renderer.render(exc, "/v2/models/m/infer", accept="application/problem+json")
    assert headers["content-type"] == "application/problem+json"
    # OpenAI answers invalid parameters with 400, not 422.
    invalid = ErrorReport(
        422, "Validation error", "input: field required", "validation_error", field="input"
    )
    status, _, raw = renderer.render_report(invalid, "/v1/embeddings")
    assert status == 400 and json.loads(raw)["error"]["param"] == "input"
    assert renderer.render_report(invalid, "/v1/classify")[0] == 422


def test_triton_errors_are_translated() -> None:
    unknown = InferenceServerException("Request for unknown model: 'm' is not found", status="400")
    assert isinstance(translate_error(unknown, "m"), errors.ModelNotFound)
    shape = InferenceServerException(
        "unexpected shape for input 'input' for model 'm'", status="400"
    )
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


def test_queue_policy_answers_are_translated() -> None:
    expired = InferenceServerException("Request timeout expired", status="503")
    assert isinstance(translate_error(expired, "m"), errors.UpstreamTimeout)
    full = InferenceServerException(
        "[request id: <id_unknown>] Exceeds maximum queue size", status="503"
    )
    overloaded = translate_error(full, "m")
    assert isinstance(overloaded, errors.Overloaded) and int(overloaded.headers["Retry-After"]) >= 1


# -- service with a fake backend -------------------------------------------------------------


_TINY = RestBody(b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}')


class FakeBackend:
    """An in-memory InferenceBackend: ``infer_v2`` answers after ``release`` is set."""

    def __init__(self, models: tuple[str, ...] = ("m", "text_embedding", "a", "b")) -> None:
        self.release = asyncio.Event()
        self.models = models
        self.index_reads = 0
        self.calls: list[dict[str, object]] = []
        self.requests: list[InferRequest] = []

    async def infer_v2(  # type: ignore[no-untyped-def]
        self, model, request, *, timeout_s, version="", accept_encoding="identity"
    ):
        self.requests.append(request)
        await self.release.wait()
        return RawResponse(b"{}", {"content-type": "application/json"})

    async def infer(  # type: ignore[no-untyped-def]
        self, model, inputs, outputs=None, *, timeout_s, version="", priority=0
    ):
        self.calls.append(
            {
                "model": model,
                "rows": len(inputs[0].data),
                "timeout_s": timeout_s,
                "priority": priority,
            }
        )
        texts = [bytes(t[0]) for t in inputs[0].data]
        # One distinct, checkable vector per text: its length and first byte.
        return {"EMBEDDING": np.array([[len(t), t[0], 1.0] for t in texts], dtype=np.float32)}

    async def repository_index(self, *, timeout_s):  # type: ignore[no-untyped-def]
        self.index_reads += 1
        return [{"name": m, "version": "1", "state": "READY"} for m in self.models]

    async def model_ready(self, model, *, timeout_s, version=""):  # type: ignore[no-untyped-def]
        return model in self.models and version in ("", "1")

    async def model_metadata(self, model, *, timeout_s, version=""):  # type: ignore[no-untyped-def]
        return {"name": model, "outputs": [{"name": "EMBEDDING"}]}


def _service(**settings: object) -> InferenceService:
    settings.setdefault("tier_limits", {"t": TierLimit(per_minute=6000, burst=100)})
    config = GatewaySettings(default_tier="t", **settings)  # type: ignore[arg-type]
    return InferenceService(
        config,
        FakeBackend(),  # type: ignore[arg-type]
        InProcessRateLimiter(),
        LatencyTracker(),
    )


def _ctx(scopes: frozenset[str] = frozenset({"*"}), tier: str = "t") -> RequestContext:
    return RequestContext(request_id="r", principal=Principal("key:x", scopes, tier, "api_key"))


async def test_in_flight_bound_refuses_the_extra_request() -> None:
    service = _service(max_in_flight_per_model=2)
    backend = service.backend
    running = [asyncio.create_task(service.infer_v2(_ctx(), "m", _TINY)) for _ in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(errors.Overloaded):
        await service.infer_v2(_ctx(), "m", _TINY)
    backend.release.set()  # type: ignore[attr-defined]
    await asyncio.gather(*running)
    assert service.admission.in_flight("m") == 0


async def test_lower_tiers_get_a_smaller_share_of_the_in_flight_bound() -> None:
    tiers = {
        "t": TierLimit(per_minute=6000, burst=100),
        "low": TierLimit(per_minute=6000, burst=100, in_flight_share=0.5),
        "high": TierLimit(per_minute=6000, burst=100, priority=1),
    }
    service = _service(max_in_flight_per_model=4, tier_limits=tiers)
    service.backend.release.clear()  # type: ignore[attr-defined]
    running = [
        asyncio.create_task(service.infer_v2(_ctx(tier="low"), "m", _TINY)) for _ in range(2)
    ]
    await asyncio.sleep(0.01)
    with pytest.raises(errors.Overloaded, match="tier 'low' may use 2 of 4"):
        await service.infer_v2(_ctx(tier="low"), "m", _TINY)
    running += [
        asyncio.create_task(service.infer_v2(_ctx(tier="high"), "m", _TINY)) for _ in range(2)
    ]
    await asyncio.sleep(0.01)
    assert service.admission.in_flight("m") == 4
    service.backend.release.set()  # type: ignore[attr-defined]
    await asyncio.gather(*running)


async def test_lower_tiers_stay_out_of_the_reserve_kept_for_the_highest_tier() -> None:
    tiers = {
        "t": TierLimit(per_minute=6000, burst=100, priority=2),  # share 1.0, but not the highest
        "high": TierLimit(per_minute=6000, burst=100, priority=1),
    }
    service = _service(max_in_flight_per_model=10, tier_limits=tiers, in_flight_reserve=0.2)
    service.backend.release.clear()  # type: ignore[attr-defined]
    running = [asyncio.create_task(service.infer_v2(_ctx(), "m", _TINY)) for _ in range(8)]
    await asyncio.sleep(0.01)
    assert service.admission.in_flight("m") == 8
    with pytest.raises(errors.CapacityReserved, match="tier 't' may use 8 of 10") as refused:
        await service.infer_v2(_ctx(), "m", _TINY)
    assert refused.value.headers["Retry-After"] == "1"
    # The highest tier takes the reserve, up to the bound.
    running += [
        asyncio.create_task(service.infer_v2(_ctx(tier="high"), "m", _TINY)) for _ in range(2)
    ]
    await asyncio.sleep(0.01)
    assert service.admission.in_flight("m") == 10
    with pytest.raises(errors.Overloaded):
        await service.infer_v2(_ctx(tier="high"), "m", _TINY)
    service.backend.release.set()  # type: ignore[attr-defined]
    await asyncio.gather(*running)
    assert service.admission.in_flight("m") == 0


async def test_no_reserve_when_every_tier_is_the_highest_the_reserve_is_off_or_under_a_slot() -> (
    None
):
    both = {
        "t": TierLimit(per_minute=6000, burst=100, priority=2),
        "high": TierLimit(per_minute=6000, burst=100, priority=1),
    }
    for tiers, reserve, bound in (
        ({"t": TierLimit(per_minute=6000, burst=100, priority=2)}, 0.2, 5),
        (both, 0.0, 5),
        # 20% of 4 is not a whole slot: nothing is kept back (a bound of 2 must not reserve half).
        (both, 0.2, 4),
    ):
        service = _service(
            max_in_flight_per_model=bound, tier_limits=tiers, in_flight_reserve=reserve
        )
        service.backend.release.clear()  # type: ignore[attr-defined]
        running = [asyncio.create_task(service.infer_v2(_ctx(), "m", _TINY)) for _ in range(bound)]
        await asyncio.sleep(0.01)
        assert service.admission.in_flight("m") == bound
        # Full: the tier's share refuses (429), not a reserve that was never kept (503).
        with pytest.raises(errors.Overloaded):
            await service.infer_v2(_ctx(), "m", _TINY)
        service.backend.release.set()  # type: ignore[attr-defined]
        await asyncio.gather(*running)


async def test_kserve_requests_carry_the_tier_priority_and_the_deadline() -> None:
    tiers = {"t": TierLimit(per_minute=6000, burst=100, priority=2)}
    service = _service(tier_limits=tiers, upstream_timeout_s=5)
    service.backend.release.set()  # type: ignore[attr-defined]
    long = RestBody(
        b'{"parameters": {"timeout": 999000000}, "inputs": [{"name": "x", "shape": [1], '
        b'"datatype": "FP32", "data": [1.0]}]}'
    )
    short = RestBody(
        b'{"parameters": {"timeout": 1000}, "inputs": [{"name": "x", "shape": [1], '
        b'"datatype": "FP32", "data": [1.0]}]}'
    )
    await service.infer_v2(_ctx(), "m", long)
    await service.infer_v2(_ctx(), "m", short)
    first, second = service.backend.requests  # type: ignore[attr-defined]
    assert first.priority == second.priority == 2
    assert 0 < first.timeout_us <= 5_000_000  # the gateway's deadline, not the client's longer one
    assert second.timeout_us == 1000  # the client's own, shorter deadline stands


async def test_scope_is_checked_before_the_limit() -> None:
    service = _service()
    with pytest.raises(errors.PermissionDenied):
        await service.infer_v2(_ctx(frozenset({"a"})), "b", _TINY)


async def test_unknown_names_make_no_state_and_cost_few_index_reads() -> None:
    service = _service(model_index_ttl_s=3600, model_index_min_refresh_s=3600)
    backend = service.backend
    for i in range(200):
        with pytest.raises(errors.ModelNotFound):
            await service.infer_v2(_ctx(), f"nope_{i}", _TINY)
    assert backend.index_reads == 1  # type: ignore[attr-defined]
    assert service.limiter._tats == {}  # type: ignore[attr-defined]
    assert service.admission._in_flight == {}
    assert "nope_" not in generate_latest(service.tracker.registry).decode()


async def test_a_stale_model_list_is_renewed_in_the_background() -> None:
    now = [0.0]
    backend = FakeBackend(models=("m",))
    catalog = ModelCatalog(backend, ttl_s=5, min_refresh_s=1, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await catalog.known("m") == {"m"} and backend.index_reads == 1
    backend.models = ("m", "new")
    now[0] = 10.0  # stale: answered at once from what was read, renewed behind the request
    assert await catalog.known("m") == {"m"}
    await asyncio.sleep(0.01)
    assert backend.index_reads == 2 and await catalog.known("new") == {"m", "new"}
    backend.models = ("m", "new", "newer")
    now[0] = 10.5  # a miss within min_refresh_s of the last read does not read again
    assert "newer" not in await catalog.known("newer") and backend.index_reads == 2
    now[0] = 11.5
    assert "newer" in await catalog.known("newer") and backend.index_reads == 3
    await catalog.close()


@pytest.mark.parametrize(
    "name", ["stats", "ready", "m/versions/1", "..", ".hidden", "a b", "x" * 129, "m%2F1", ""]
)
async def test_reserved_and_impossible_names_are_refused_before_triton(name: str) -> None:
    service = _service()
    with pytest.raises(errors.BadRequest) as refused:
        await service.model_metadata(_ctx(), name)
    assert refused.value.field == "model"
    assert service.backend.index_reads == 0  # type: ignore[attr-defined]


async def test_the_key_limit_spans_models() -> None:
    tiers = {"t": TierLimit(per_minute=6000, burst=100, key_per_minute=1, key_burst=3)}
    service = _service(tier_limits=tiers)
    service.backend.release.set()  # type: ignore[attr-defined]
    for model in ("m", "a", "b"):
        await service.infer_v2(_ctx(), model, _TINY)
    with pytest.raises(errors.RateLimited, match="across all models"):
        await service.infer_v2(_ctx(), "m", _TINY)
    with pytest.raises(
        errors.RateLimited
    ):  # unknown names spend the key's bucket too, and make no other
        await service.infer_v2(_ctx(), "unknown_model", _TINY)


async def test_traffic_pins_only_ready_versions() -> None:
    service = _service()
    with pytest.raises(errors.Conflict) as conflict:
        await service.pin_traffic("m", {"1": 0.9, "2": 0.1})
    assert conflict.value.field == "versions.2"
    with pytest.raises(errors.ModelNotFound):
        await service.pin_traffic("missing", {"1": 1})
    with pytest.raises(errors.BadRequest):
        await service.pin_traffic("stats", {"1": 1})
    await service.pin_traffic("m", {"1": 1, "2": 0})  # a zero weight needs no READY version
    assert service.traffic.snapshot() == {"m": {"1": 1.0}}


async def test_an_unlimited_tier_takes_no_rate_limit_token() -> None:
    tiers = {"t": TierLimit(per_minute=6000, burst=100), "enterprise": TierLimit(priority=1)}
    assert tiers["enterprise"].unlimited and not tiers["t"].unlimited
    with pytest.raises(ValueError, match="go together"):
        TierLimit(per_minute=10)
    buckets: list[str] = []

    class Counting(InProcessRateLimiter):
        async def hit(self, bucket, limit):  # type: ignore[no-untyped-def]
            buckets.append(bucket)
            return await super().hit(bucket, limit)

    config = GatewaySettings(default_tier="t", tier_limits=tiers)
    service = InferenceService(config, FakeBackend(), Counting(), LatencyTracker())  # type: ignore[arg-type]
    enterprise = RequestContext(
        request_id="r", principal=Principal("key:e", frozenset({"*"}), "enterprise", "api_key")
    )
    for _ in range(3):
        async with service.admission.admit(enterprise, "m") as ticket:
            assert ticket.priority == 1
    assert enterprise.rate is None and enterprise.admitted and buckets == []
    async with service.admission.admit(_ctx(), "m"):
        pass
    assert buckets  # the limited tier does take tokens


@pytest.mark.parametrize("enabled", [True, False])
async def test_server_timing_follows_the_setting_and_skips_anonymous_callers(enabled: bool) -> None:
    from gateway.http.middleware import ContextMiddleware
    from gateway.tenancy.context import CONTEXT_KEY

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        ctx = scope[CONTEXT_KEY]
        if scope["path"] == "/signed-in":
            ctx.principal = Principal("key:a", frozenset({"*"}), "free", "api_key")
            with ctx.stages.stage("auth"):
                pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = ContextMiddleware(app, LatencyTracker(), server_timing=enabled)

    async def headers(path: str) -> dict[bytes, bytes]:
        sent: list[dict[str, object]] = []

        async def send(message):  # type: ignore[no-untyped-def]
            sent.append(message)

        await middleware({"type": "http", "path": path, "method": "GET", "headers": []}, None, send)
        return dict(sent[0]["headers"])  # type: ignore[arg-type]

    signed_in = await headers("/signed-in")
    assert (b"server-timing" in signed_in) is enabled
    if enabled:
        assert (
            signed_in[b"server-timing"].startswith(b"auth;dur=")
            and b", total;dur=" in signed_in[b"server-timing"]
        )
    assert b"server-timing" not in await headers("/anonymous")
