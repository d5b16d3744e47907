"""The short-lived store behind image URLs: owner-bound, expiring, bounded in bytes; in memory and in
Redis (a real redis-server), with the same behaviour."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

from gateway.jobs.image_store import ImageStore, MemoryImageStore, RedisImageStore
from tests.support.fake_clock import FakeClock


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[object]:
    made: list[ImageStore] = []
    prefix = f"t{uuid.uuid4().hex[:8]}:"

    def make(ttl_s: float, max_bytes: int, clock: FakeClock) -> ImageStore:
        if request.param == "memory":
            store: ImageStore = MemoryImageStore(ttl_s, max_bytes, clock=clock)
        else:
            store = RedisImageStore(
                request.getfixturevalue("redis_url"), ttl_s, max_bytes, prefix=prefix, clock=clock
            )
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


async def test_only_the_owner_gets_an_image_and_only_until_it_expires(  # type: ignore[no-untyped-def]
    make_store,
) -> None:
    clock = FakeClock(time.time())
    store = make_store(60, 1000, clock)
    token = await store.put("key:a", b"\x89PNG\x00\xff", "image/png")
    image = await store.get("key:a", token)
    assert len(token) >= 32 and image is not None and image.data == b"\x89PNG\x00\xff"
    assert image.media_type == "image/png" and store.remaining_s(image) == 60
    assert await store.get("key:b", token) is None and await store.get("key:a", "guess") is None
    clock.now += 61
    assert await store.get("key:a", token) is None


async def test_the_oldest_images_go_first_past_the_byte_bound(  # type: ignore[no-untyped-def]
    make_store,
) -> None:
    clock = FakeClock(time.time())
    store = make_store(60, 10, clock)
    first = await store.put("o", b"12345", "image/png")
    clock.now += 1
    second = await store.put("o", b"12345", "image/png")
    clock.now += 1
    third = await store.put("o", b"123", "image/png")
    assert (
        await store.get("o", first) is None
        and await store.get("o", second)
        and await store.get("o", third)
    )
    if isinstance(store, MemoryImageStore):
        assert store.bytes == 8
    clock.now += 60  # both expire: a 10-byte image fits again
    fourth = await store.put("o", b"x" * 10, "image/png")
    assert await store.get("o", fourth) is not None
    with pytest.raises(ValueError):
        await store.put("o", b"x" * 11, "image/png")


async def test_a_url_made_by_one_replica_is_served_by_another(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    one, other = (RedisImageStore(redis_url, 60, 1000, prefix=prefix) for _ in range(2))
    try:
        token = await one.put("key:a", b"png", "image/png")
        image = await other.get("key:a", token)
        assert (
            image is not None and image.data == b"png" and await other.get("key:b", token) is None
        )
    finally:
        await one.close()
        await other.close()
