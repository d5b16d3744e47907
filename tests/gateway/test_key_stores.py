"""The two key stores behind one interface (SQLite, and Redis on a real redis-server), key export and
import between them, and canary weights in Redis."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest
import redis

from gateway.errors import BadRequest
from gateway.tenancy.keys import (
    ApiKeyRecord,
    KeyConflict,
    KeyStore,
    KeyStoreUnavailable,
    records_from_export,
)
from gateway.tenancy.keys_sqlite import SqliteKeyStore
from gateway.tenancy.redis_state import RedisKeyStore, RedisTrafficStore, connect, read_versions
from gateway.tenancy.traffic import Route, TrafficSplit
from serving.ports import reserve_port

pytestmark = pytest.mark.integration

_prefixes = (f"test{n}:" for n in itertools.count())


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path, redis_url) -> Iterator[KeyStore]:  # type: ignore[no-untyped-def]
    """Each test runs against both stores; Redis ones get a fresh prefix (no flush of a shared server)."""
    opened: KeyStore = (
        SqliteKeyStore(tmp_path / "keys.sqlite3")
        if request.param == "sqlite"
        else RedisKeyStore(redis_url, prefix=next(_prefixes))
    )
    yield opened
    opened.close()


def test_create_verify_rotate_revoke(store: KeyStore) -> None:
    key_id, plaintext = store.create("app", ["tiny_linear"], "free")
    record = store.verify(plaintext)
    assert record is not None and record.key_id == key_id and record.allows("tiny_linear")
    assert not record.allows("other") and record.key_hash and plaintext not in repr(record)
    assert store.verify(plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")) is None
    new = store.rotate(key_id)
    assert store.verify(plaintext) is None and store.verify(new) is not None
    revoked = store.revoke(key_id)
    assert store.verify(new) is None and revoked.revoked
    assert store.revoke(key_id).revoked_at == revoked.revoked_at  # idempotent: first time kept
    with pytest.raises(KeyError):
        store.rotate(key_id)
    with pytest.raises(KeyError):
        store.revoke("0" * 12)
    assert store.get("0" * 12) is None


def test_listing_is_oldest_first_and_can_hide_revoked(store: KeyStore) -> None:
    ids = [store.create(f"k{i}")[0] for i in range(3)]
    store.revoke(ids[1])
    assert [r.key_id for r in store.list()] == ids
    assert [r.key_id for r in store.list(include_revoked=False)] == [ids[0], ids[2]]


@pytest.mark.parametrize("direction", ["sqlite->redis", "redis->sqlite"])
def test_export_import_keeps_every_key_working(  # type: ignore[no-untyped-def]
    direction: str, tmp_path, redis_url
) -> None:
    sqlite_store, redis_store = (
        SqliteKeyStore(tmp_path / "k.sqlite3"),
        RedisKeyStore(redis_url, prefix=next(_prefixes)),
    )
    source, target = (
        (sqlite_store, redis_store) if direction == "sqlite->redis" else (redis_store, sqlite_store)
    )
    live_id, live = source.create("live", ["tiny_linear"], "standard")
    rotated_id, _ = source.create("rotated")
    rotated = source.rotate(rotated_id)
    gone_id, gone = source.create("gone")
    source.revoke(gone_id)
    exported = [r.as_export() for r in source.list()]
    assert all("key_hash" in e and live not in str(e) for e in exported)  # hashes, never plaintext

    result = target.import_records(records_from_export(exported))
    assert (
        sorted(result.imported) == sorted([live_id, rotated_id, gone_id]) and result.skipped == []
    )
    assert target.list() == source.list()  # ids, hashes, scopes, tiers and times all kept
    assert target.verify(live) is not None and target.verify(rotated) is not None
    assert target.verify(gone) is None  # still revoked
    again = target.import_records(records_from_export(exported))  # a re-run is harmless
    assert again.imported == [] and sorted(again.skipped) == sorted([live_id, rotated_id, gone_id])
    redis_store.close()


def test_import_is_all_or_nothing(store: KeyStore) -> None:
    key_id, _ = store.create("present")
    present = store.get(key_id)
    assert present is not None
    fresh = ApiKeyRecord("ab" * 6, "fresh", ("*",), "free", 1.0, None, None, "0" * 64)
    changed = ApiKeyRecord(
        key_id, "present", present.scopes, present.tier, present.created_at, None, None, "f" * 64
    )
    with pytest.raises(KeyConflict) as info:
        store.import_records([fresh, changed])
    assert info.value.key_ids == [key_id]
    assert store.get(fresh.key_id) is None and store.get(key_id) == present  # nothing written
    with pytest.raises(ValueError, match="twice"):
        store.import_records([fresh, fresh])
    with pytest.raises(ValueError, match="hex SHA-256"):
        store.import_records(
            [ApiKeyRecord("cd" * 6, "x", ("*",), "free", 1.0, None, None, "nothex")]
        )
    assert store.get(fresh.key_id) is None and store.get("cd" * 6) is None


def test_every_change_a_cache_could_miss_moves_the_version(redis_url: str) -> None:
    prefix = next(_prefixes)
    store, client = RedisKeyStore(redis_url, prefix=prefix), connect(redis_url, 1.0)
    start = read_versions(client, prefix).keys
    key_id, _ = store.create("v")
    assert read_versions(client, prefix).keys == start  # a new id: no process can have cached it
    seen = [start]
    store.rotate(key_id)
    seen.append(read_versions(client, prefix).keys)
    store.revoke(key_id)
    seen.append(read_versions(client, prefix).keys)
    store.import_records(
        [ApiKeyRecord("ab" * 6, "imported", ("*",), "free", 1.0, None, None, "0" * 64)]
    )
    seen.append(
        read_versions(client, prefix).keys
    )  # its id may have been presented (and refused) before
    store.revoke(key_id)  # already revoked: nothing changed, no bump needed
    assert seen == sorted(set(seen)) and len(seen) == 4
    assert read_versions(client, prefix).keys == seen[-1]
    store.close()
    client.close()


def test_canary_weights_reach_another_process_through_redis(redis_url: str) -> None:
    prefix = next(_prefixes)
    client = connect(redis_url, 1.0)
    here, there = (TrafficSplit(store=RedisTrafficStore(client, prefix)) for _ in range(2))

    async def scenario() -> None:
        before = read_versions(client, prefix).traffic
        await here.update("m", {"1": 3, "2": 1, "3": 0})
        assert here.snapshot() == {"m": {"1": 0.75, "2": 0.25}}
        assert read_versions(client, prefix).traffic > before
        await there.reload()
        assert there.snapshot() == here.snapshot()
        with pytest.raises(BadRequest):
            await here.update("m", {"1": -1})  # refused before anything is written
        await there.reload()
        assert there.snapshot() == {"m": {"1": 0.75, "2": 0.25}}
        assert await there.remove("m") and not await there.remove("m")
        await here.reload()
        assert here.snapshot() == {} and here.pick("m") == ""

    asyncio.run(scenario())
    client.close()


def test_canary_outcomes_add_up_across_processes_through_redis(redis_url: str) -> None:
    """What each replica's weights routed is counted per target and summed in Redis for the promoter."""
    prefix = next(_prefixes)
    client = connect(redis_url, 1.0)
    here, there = (TrafficSplit(store=RedisTrafficStore(client, prefix)) for _ in range(2))

    async def scenario() -> None:
        await here.update("ens", {"1": 1, "model:ens__canary": 1})
        await there.reload()
        here.observe("ens", Route("ens", "1"), ok=True)
        here.observe("ens", Route("ens__canary"), ok=False)
        there.observe("ens", Route("ens", "1"), ok=True)
        there.observe("ens", Route("ens__canary"), ok=True)
        there.observe("other", Route("other"), ok=False)  # not pinned: not counted
        await there.flush()
        assert await here.outcomes("ens") == {
            "1": {"answered": 2, "failed": 0},
            "model:ens__canary": {"answered": 1, "failed": 1},
        }
        assert await here.outcomes("other") == {}
        assert await there.remove("ens")  # unpinned: the counts go with the weights
        assert await here.outcomes("ens") == {}

    asyncio.run(scenario())
    client.close()


def test_an_unreachable_redis_is_reported_not_raised_raw() -> None:
    store = RedisKeyStore(
        f"redis://127.0.0.1:{reserve_port()}/0", timeout_s=0.2
    )  # nothing listens there
    with pytest.raises(KeyStoreUnavailable) as info:
        store.get("0" * 12)
    assert isinstance(info.value.__cause__, redis.RedisError)
