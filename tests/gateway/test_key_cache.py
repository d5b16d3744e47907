"""The API key cache: concurrent misses share one store lookup, and a key in use is refreshed in the
background before it expires, so its requests never wait for the store; revocation still arrives
within the cache's lifetime. A real SQLite key store, counted; the clock is the test's."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.errors import AuthenticationError
from gateway.settings import GatewaySettings
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.keys import ApiKeyRecord
from gateway.tenancy.keys_sqlite import SqliteKeyStore
from tests.support.fake_clock import FakeClock


class CountingStore(SqliteKeyStore):
    """Counts lookups; while ``hold`` is clear, a lookup waits for it (to catch one in flight)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gets = 0
        self.hold = threading.Event()
        self.hold.set()

    def get(self, key_id: str) -> ApiKeyRecord | None:
        self.gets += 1
        assert self.hold.wait(10), "the test never released the lookup"
        return super().get(key_id)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (the background lookup's progress), at most 10 s."""
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


async def test_concurrent_misses_share_one_lookup(tmp_path: Path, clock: FakeClock) -> None:
    store = CountingStore(tmp_path / "keys.sqlite3")
    key_id, key = store.create("a", ["*"], "free")
    auth = Authenticator(GatewaySettings(key_cache_ttl_s=5), store, clock)
    headers = {"authorization": f"Bearer {key}"}
    principals = await asyncio.gather(*(auth.authenticate(headers) for _ in range(20)))
    assert store.gets == 1 and {p.client_id for p in principals} == {f"key:{key_id}"}
    clock.now += 6  # expired: the next burst shares one lookup again
    await asyncio.gather(*(auth.authenticate(headers) for _ in range(20)))
    assert store.gets == 2


async def test_a_key_in_use_is_refreshed_before_it_expires(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = CountingStore(tmp_path / "keys.sqlite3")
    key_id, key = store.create("a", ["*"], "free")
    auth = Authenticator(GatewaySettings(key_cache_ttl_s=5), store, clock)
    headers = {"authorization": f"Bearer {key}"}
    await auth.authenticate(headers)
    clock.now += 4.5  # past 80% of the lifetime: refreshed in the background
    store.hold.clear()  # the refresh hangs in the store...
    principal = await asyncio.wait_for(
        auth.authenticate(headers), 5
    )  # ...and the request does not wait
    assert principal.client_id == f"key:{key_id}"
    await _until(lambda: store.gets == 2)  # the refresh reached the store
    await asyncio.wait_for(auth.authenticate(headers), 5)  # one refresh at a time
    assert store.gets == 2
    # Revoked meanwhile (by another process): the refresh, held in the store until now, brings it.
    SqliteKeyStore(tmp_path / "keys.sqlite3").revoke(key_id)
    store.hold.set()
    await _until(lambda: not auth._lookups)  # noqa: SLF001  (the refresh has landed)
    with pytest.raises(AuthenticationError, match="revoked"):
        await auth.authenticate(headers)
    assert store.gets == 2


async def test_unknown_ids_cost_and_answer_what_a_wrong_secret_does(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The decision path, not its timing: the same hashing and comparison, the same answer.
    import gateway.tenancy.keys as keys_module
    from gateway.tenancy.keys import new_key

    store = CountingStore(tmp_path / "keys.sqlite3")
    key_id, key = store.create("a", ["*"], "free")
    auth = Authenticator(GatewaySettings(key_cache_ttl_s=5), store, clock)
    calls: list[str] = []
    real_hash, real_compare = keys_module.hash_key, keys_module.hmac.compare_digest
    monkeypatch.setattr(
        keys_module, "hash_key", lambda text: calls.append("hash") or real_hash(text)
    )
    monkeypatch.setattr(
        keys_module.hmac,
        "compare_digest",
        lambda a, b: calls.append("compare") or real_compare(a, b),
    )

    async def refusal(credential: str) -> tuple[str, list[str]]:
        calls.clear()
        with pytest.raises(AuthenticationError) as refused:
            await auth.authenticate({"authorization": f"Bearer {credential}"})
        return refused.value.detail, list(calls)

    wrong_secret = new_key(key_id)[1]
    unknown = new_key()[1]
    assert (
        await refusal(wrong_secret)
        == await refusal(unknown)
        == ("invalid API key", ["hash", "compare"])
    )


async def test_made_up_ids_never_push_real_keys_out_of_the_cache(
    tmp_path: Path, clock: FakeClock
) -> None:
    from gateway.tenancy.auth import _CACHE_ENTRIES
    from gateway.tenancy.keys import new_key

    store = CountingStore(tmp_path / "keys.sqlite3")
    _, key = store.create("a", ["*"], "free")
    auth = Authenticator(GatewaySettings(key_cache_ttl_s=600), store, clock)
    await auth.authenticate({"authorization": f"Bearer {key}"})
    for _ in range(_CACHE_ENTRIES + 2):  # more made-up ids than the cache holds
        with pytest.raises(AuthenticationError):
            await auth.authenticate({"authorization": f"Bearer {new_key()[1]}"})
    gets = store.gets
    await auth.authenticate({"authorization": f"Bearer {key}"})
    assert store.gets == gets, "the real key was looked up again"
