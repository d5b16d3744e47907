"""Generated images kept for a short while, for ``response_format: "url"``.

``/v1/images/generations`` with ``url`` answers links to ``GET /v1/images/files/{token}`` instead of
the bytes. Each image is held for ``ttl_s`` seconds and handed out only to the credential that
generated it (the token alone is not enough; it is also long and random, so it cannot be guessed).
The store is bounded in bytes: past the bound the oldest images go first, and an image that is gone
answers 404 like one that never was. The URLs themselves are signed and expire
(:mod:`gateway.jobs.image_urls`), so they open without the key; the route checks the signature before it
asks the store (``owner=None``).

Two stores, one behaviour: :class:`MemoryImageStore` in the process (the single-process default) and
:class:`RedisImageStore` when ``GATEWAY_REDIS_URL`` is set, so a URL made by one replica or worker is
served by every other. In Redis, under the gateway's prefix: ``<p>img:<token>`` (hash: owner, media
type, bytes; expiring), ``<p>img:index`` (tokens by expiry), ``<p>img:sizes`` and ``<p>img:bytes``
(the byte bound's bookkeeping); a put is one Lua script (expire, evict the oldest, store).
"""

from __future__ import annotations

import math
import secrets
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.jobs.redis_calls import open_redis, redis_call

__all__ = ["ImageStore", "MemoryImageStore", "RedisImageStore", "StoredImage"]


@dataclass(frozen=True)
class StoredImage:
    """One image: whose it is, its bytes and media type, and when it stops being served (store clock)."""

    owner: str
    data: bytes
    media_type: str
    expires: float


class ImageStore(ABC):
    """Images by random token, per owner, expiring and bounded in bytes.

    Args:
        ttl_s: how long an image is served after it was made.
        max_bytes: most bytes held; the oldest images are dropped past it.
        clock: seconds (tests pass their own).
    """

    def __init__(self, ttl_s: float, max_bytes: int, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock

    def remaining_s(self, image: StoredImage) -> int:
        """Whole seconds ``image`` is still served (for ``Cache-Control: max-age``)."""
        return max(0, math.ceil(image.expires - self._clock() - 0.001))

    def _check_size(self, data: bytes) -> None:
        if len(data) > self.max_bytes:
            raise ValueError(
                f"an image of {len(data)} bytes does not fit a store of {self.max_bytes}"
            )

    @abstractmethod
    async def put(self, owner: str, data: bytes, media_type: str) -> str:
        """Keep ``data`` for ``owner``; returns the token of its URL.

        Raises:
            ValueError: one image is larger than the whole store.
            StateStoreUnavailable: the shared store cannot be reached.
        """

    @abstractmethod
    async def get(self, owner: str | None, token: str) -> StoredImage | None:
        """The image behind ``token`` if ``owner`` made it (``None``: anyone, once a signed URL was
        checked) and it has not expired, else ``None``."""

    async def close(self) -> None:
        return None


class MemoryImageStore(ImageStore):
    """Images in this process's memory (monotonic clock)."""

    def __init__(
        self, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(ttl_s, max_bytes, clock)
        self._images: OrderedDict[str, StoredImage] = OrderedDict()
        self._bytes = 0

    async def put(self, owner: str, data: bytes, media_type: str) -> str:
        self._check_size(data)
        now = self._clock()
        self._expire(now)
        while self._bytes + len(data) > self.max_bytes:
            self._drop(next(iter(self._images)))
        token = secrets.token_urlsafe(24)
        self._images[token] = StoredImage(owner, data, media_type, now + self.ttl_s)
        self._bytes += len(data)
        return token

    async def get(self, owner: str | None, token: str) -> StoredImage | None:
        self._expire(self._clock())
        image = self._images.get(token)
        if image is None or (owner is not None and not secrets.compare_digest(image.owner, owner)):
            return None
        return image

    def __len__(self) -> int:
        return len(self._images)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _expire(self, now: float) -> None:
        # Insertion order is expiry order (one TTL for all): stop at the first live image.
        while self._images:
            token, image = next(iter(self._images.items()))
            if image.expires > now:
                return
            self._drop(token)

    def _drop(self, token: str) -> None:
        image = self._images.pop(token)
        self._bytes -= len(image.data)


# KEYS: index, sizes, bytes. ARGV: image key prefix, now, ttl, max_bytes, token, owner, media_type, data.
_PUT = """
local now, max, size = tonumber(ARGV[2]), tonumber(ARGV[4]), string.len(ARGV[8])
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local function drop(token)
  total = total - tonumber(redis.call('HGET', KEYS[2], token) or '0')
  redis.call('HDEL', KEYS[2], token)
  redis.call('ZREM', KEYS[1], token)
  redis.call('DEL', ARGV[1] .. token)
end
for _, token in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do drop(token) end
while total + size > max do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #oldest == 0 then total = 0 break end
  drop(oldest[1])
end
local expires = now + tonumber(ARGV[3])
local key = ARGV[1] .. ARGV[5]
redis.call('HSET', key, 'owner', ARGV[6], 'media_type', ARGV[7], 'data', ARGV[8],
  'expires', string.format('%.6f', expires))
redis.call('PEXPIREAT', key, math.ceil(expires * 1000))
redis.call('ZADD', KEYS[1], string.format('%.3f', expires), ARGV[5])
redis.call('HSET', KEYS[2], ARGV[5], size)
redis.call('SET', KEYS[3], math.max(0, total) + size)
return 1
"""


class RedisImageStore(ImageStore):
    """Images in Redis, shared by every replica and worker (wall-clock time).

    Args:
        url: a ``redis://`` URL.
        ttl_s, max_bytes: as :class:`ImageStore`.
        prefix: the gateway's key namespace.
        timeout_s: connect timeout (commands get more: they carry images).
    """

    def __init__(
        self,
        url: str,
        ttl_s: float,
        max_bytes: int,
        *,
        prefix: str = "gw:",
        timeout_s: float = 0.25,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(ttl_s, max_bytes, clock)
        self._redis = open_redis(url, timeout_s)
        self._prefix = prefix + "img:"
        self._put = self._redis.register_script(_PUT)

    async def _call(self, call: Any) -> Any:
        return await redis_call("image store", call)

    async def put(self, owner: str, data: bytes, media_type: str) -> str:
        self._check_size(data)
        token = secrets.token_urlsafe(24)
        p = self._prefix
        await self._call(
            self._put(
                keys=[p + "index", p + "sizes", p + "bytes"],
                args=[p, self._clock(), self.ttl_s, self.max_bytes, token, owner, media_type, data],
            )
        )
        return token

    async def get(self, owner: str | None, token: str) -> StoredImage | None:
        stored_owner, media_type, data, expires = await self._call(
            self._redis.hmget(self._prefix + token, "owner", "media_type", "data", "expires")
        )
        if stored_owner is None or (
            owner is not None and not secrets.compare_digest(stored_owner, owner.encode())
        ):
            return None
        image = StoredImage(stored_owner.decode(), data, media_type.decode(), float(expires))
        return image if image.expires > self._clock() else None

    async def close(self) -> None:
        await self._redis.aclose()
