"""The asyncio Redis client of the job and image stores, and what a failed call on it becomes.

Both stores carry images through Redis, so a command may take longer than connecting does.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from gateway.errors import StateStoreUnavailable

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["open_redis", "redis_call"]

T = TypeVar("T")


def open_redis(url: str, timeout_s: float) -> aioredis.Redis:
    """A client that connects within ``timeout_s``; a command gets 8 times that, 2 s at least."""
    import redis.asyncio as aioredis  # the gateway extra provides it; imported only when used

    return aioredis.Redis.from_url(
        url, socket_timeout=max(2.0, timeout_s * 8), socket_connect_timeout=timeout_s
    )


async def redis_call(store: str, call: Awaitable[T]) -> T:
    """What ``call`` returns; any Redis or socket failure is a 503 naming ``store``."""
    try:
        return await call
    except Exception as exc:  # any Redis/socket failure
        raise StateStoreUnavailable(
            f"the {store} (Redis) failed ({type(exc).__name__})", retry_after_s=1
        ) from exc
