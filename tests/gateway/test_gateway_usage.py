"""Usage metering per key, model and day: counted by real gateways in front of real Triton, added up
across two gateways sharing one Redis, readable by the key's owner and the admin, exported as CSV."""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from gateway.tenancy.usage import RequestUsage, UsageMeter, UsageRow, UsageStoreError
from gateway.tenancy.usage_store import SqliteUsageStore
from serving.ports import reserve_port
from tests.support.gateway_procs import (
    ADMIN_TOKEN,
    TEST_TIERS,
    GatewayProcess,
    create_key,
    tiny_request,
)

INFER = "/v2/models/tiny_linear/infer"
_ADMIN = {"X-Admin-Token": ADMIN_TOKEN}


# -- the meter alone (real SQLite) -------------------------------------------------------------------


async def test_meter_adds_up_in_sqlite_across_meters(tmp_path: Path) -> None:
    store = SqliteUsageStore(tmp_path / "usage.sqlite3")
    first, second = UsageMeter(store), UsageMeter(SqliteUsageStore(tmp_path / "usage.sqlite3"))
    day = dt.datetime(2026, 12, 2, 23, 59, tzinfo=dt.UTC).timestamp()
    for _ in range(3):
        first.record("key:a", "m", 200, RequestUsage(inputs=2, tokens=11), 0.001, now=day)
    second.record("key:a", "m", 200, RequestUsage(images=4), 0.002, now=day)
    second.record("key:a", "m", 502, RequestUsage(inputs=9), 0.5, now=day)
    second.record("key:b", "m", 200, RequestUsage(), 0.0, now=day + 120)  # the next UTC day
    await first.flush()
    await second.flush()
    rows = await first.read("2026-12-01", "2026-12-03", None)
    assert [(r.day, r.client) for r in rows] == [("2026-12-02", "key:a"), ("2026-12-03", "key:b")]
    # A failed request counts as failed with its compute time, not its inputs.
    assert rows[0].counts() == {
        "requests": 4,
        "failed": 1,
        "images": 4,
        "inputs": 6,
        "tokens": 33,
        "compute_us": 505_000,
    }
    assert [r.client for r in await second.read("2026-12-01", "2026-12-03", "key:b")] == ["key:b"]


async def test_a_batch_sent_twice_counts_once(tmp_path: Path) -> None:
    store = SqliteUsageStore(tmp_path / "usage.sqlite3")
    rows = [UsageRow("2026-12-02", "key:a", "m", requests=2, tokens=7)]
    await store.add("batch-1", rows)
    await store.add("batch-1", rows)  # a retry of a batch whose answer was lost
    await store.add("batch-2", rows)
    (row,) = await store.read("2026-12-02", "2026-12-02", "key:a")
    assert (row.requests, row.tokens) == (4, 14)


class _Unreachable:
    """A store that always fails (a unit test of the meter's retry, no claim about a real store)."""

    async def add(self, batch: str, rows: list[UsageRow]) -> None:
        raise UsageStoreError("down")

    async def read(self, first_day: str, last_day: str, client: str | None) -> list[UsageRow]:
        raise UsageStoreError("down")

    async def close(self) -> None:
        return None


async def test_counts_survive_a_failed_flush(tmp_path: Path) -> None:
    meter = UsageMeter(_Unreachable())
    meter.record("key:a", "m", 200, RequestUsage(inputs=1), 0.0)
    with pytest.raises(UsageStoreError):
        await meter.flush()
    meter.record("key:a", "m", 200, RequestUsage(inputs=1), 0.0)
    meter.store = SqliteUsageStore(tmp_path / "usage.sqlite3")
    await meter.flush()
    today = dt.datetime.now(dt.UTC).date().isoformat()
    (row,) = await meter.read(today, today, "key:a")
    assert (row.requests, row.inputs) == (2, 2)


# -- real gateways, real Triton ------------------------------------------------------------------------


def _usage(
    gateway: GatewayProcess, headers: dict[str, str], path: str = "/v1/usage", **params: str
) -> httpx.Response:
    return httpx.get(gateway.url + path, headers=headers, params=params, timeout=10)


def _row(report: dict, client: str, model: str = "tiny_linear") -> dict:  # type: ignore[type-arg]
    (row,) = [r for r in report["data"] if r["client"] == client and r["model"] == model]
    return row  # type: ignore[no-any-return]


@pytest.mark.integration
def test_usage_per_key_model_and_day_readable_by_owner_and_admin(
    gateway_factory, tiny_triton
) -> None:  # type: ignore[no-untyped-def]
    gateway = gateway_factory(
        tiny_triton.http_url, usage_flush_interval_s=0.2, grpc_port=reserve_port()
    )
    headers_a, key_a = create_key(gateway, name="usage-a")
    headers_b, key_b = create_key(gateway, name="usage-b")
    id_a, id_b = f"key:{key_a['key_id']}", f"key:{key_b['key_id']}"
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        for _ in range(7):
            assert client.post(INFER, json=tiny_request(), headers=headers_a).status_code == 200
        # Admitted, then refused by Triton: a failed request (its compute time counts).
        bad = {
            "inputs": [
                {"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}
            ]
        }
        assert client.post(INFER, json=bad, headers=headers_a).status_code == 400
        for _ in range(3):
            assert client.post(INFER, json=tiny_request(), headers=headers_b).status_code == 200
    # The gRPC entry is metered the same way.
    rows = grpcclient.InferInput("input", [1, 4], "FP32")
    rows.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    through = grpcclient.InferenceServerClient(gateway.grpc_url)
    try:
        for _ in range(2):
            through.infer(
                "tiny_linear", [rows], headers={"authorization": headers_a["Authorization"]}
            )
    finally:
        through.close()

    mine = _usage(gateway, headers_a)
    assert mine.status_code == 200, mine.text
    report = mine.json()
    assert report["client"] == id_a and {r["client"] for r in report["data"]} == {id_a}
    row = _row(report, id_a)
    assert row["day"] == dt.datetime.now(dt.UTC).date().isoformat()
    assert (row["requests"], row["failed"], row["images"], row["inputs"]) == (9, 1, 0, 0)
    assert row["compute_ms"] > 0 and report["totals"]["requests"] == 9

    # CSV: the same rows.
    exported = _usage(gateway, headers_a, format="csv")
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
    assert "attachment" in exported.headers["content-disposition"]
    (csv_row,) = list(csv.DictReader(io.StringIO(exported.text)))
    assert (
        csv_row["client"] == id_a and int(csv_row["requests"]) == 9 and int(csv_row["failed"]) == 1
    )

    # The admin reads any key, or all of them.
    one = _usage(gateway, _ADMIN, "/admin/usage", key_id=str(key_b["key_id"])).json()
    assert {r["client"] for r in one["data"]} == {id_b} and _row(one, id_b)["requests"] == 3
    every = _usage(gateway, _ADMIN, "/admin/usage").json()
    assert _row(every, id_a)["requests"] == 9 and _row(every, id_b)["requests"] == 3

    # Only the admin reads /admin/usage; nobody reads usage without a credential.
    assert _usage(gateway, headers_a, "/admin/usage").status_code in (401, 403)
    assert _usage(gateway, {}).status_code == 401
    # Bad ranges name the field.
    backwards = _usage(gateway, headers_a, start="2026-12-05", end="2026-12-01")
    assert backwards.status_code == 400 and "start" in backwards.text
    too_long = _usage(gateway, headers_a, start="2020-01-01", end="2026-12-01")
    assert too_long.status_code == 400
    assert _usage(gateway, headers_a, start="yesterday").status_code in (400, 422)
    # The calendar's edges (found by schemathesis: counting 30 days back from 0001-01-01 was a 500).
    assert _usage(gateway, headers_a, end="0001-01-01").status_code == 200
    assert _usage(gateway, headers_a, start="9999-12-31").status_code == 400


@pytest.mark.integration
def test_usage_adds_up_across_two_gateways_sharing_redis(
    gateway_factory, tiny_triton, redis_url, tmp_path_factory
) -> None:  # type: ignore[no-untyped-def]
    workdir = tmp_path_factory.mktemp("usage-redis")
    settings = {"redis_url": redis_url, "usage_flush_interval_s": 0.2}
    first, second = (
        gateway_factory(tiny_triton.http_url, workdir=workdir, **settings) for _ in range(2)
    )
    headers, key = create_key(first, name="usage-shared")
    client_id = f"key:{key['key_id']}"
    for gateway, count in ((first, 5), (second, 4)):
        for _ in range(count):
            assert (
                httpx.post(
                    gateway.url + INFER, json=tiny_request(), headers=headers, timeout=10
                ).status_code
                == 200
            )
    deadline = time.monotonic() + 15  # the other process flushes every 0.2 s
    while True:
        report = _usage(first, headers).json()
        counted = sum(r["requests"] for r in report["data"])
        if counted == 9:
            break
        assert counted < 9, report
        assert time.monotonic() < deadline, f"usage never added up to 9 (last {counted})"
        time.sleep(0.1)
    assert (
        _row(_usage(second, _ADMIN, "/admin/usage", client=client_id).json(), client_id)["requests"]
        == 9
    )


@pytest.mark.integration
def test_an_unlimited_tier_is_not_limited_and_still_metered(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton
) -> None:
    tiers = {**TEST_TIERS, "enterprise": {"priority": 1}}
    gateway = gateway_factory(tiny_triton.http_url, tier_limits=tiers, usage_flush_interval_s=0.2)
    headers, key = create_key(gateway, tier="enterprise", name="enterprise")
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as client:
        answers = [
            client.post(INFER, json=tiny_request()) for _ in range(30)
        ]  # past every other tier's burst
        assert [a.status_code for a in answers] == [200] * 30
        assert not any("ratelimit-limit" in a.headers for a in answers)
        report = client.get("/v1/usage").json()
    assert _row(report, f"key:{key['key_id']}")["requests"] == 30
