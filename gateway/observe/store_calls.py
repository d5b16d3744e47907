"""How the stores of latency sketches (:mod:`gateway.observe.stats_store`) and of usage
(:mod:`gateway.tenancy.usage_store`) call SQLite and Redis: SQLite off the event loop, and a failure of
either as the store's own error, which its callers catch.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["open_redis", "redis_call", "sqlite_call"]

P = ParamSpec("P")
R = TypeVar("R")


def open_redis(url: str, timeout_s: float) -> aioredis.Redis:
    """A client that connects within ``timeout_s``; a command gets 4 times that, 1 s at least (reads
    of a whole window are larger than one rate-limit check)."""
    import redis.asyncio as aioredis  # the gateway extra provides it; imported only when used

    return aioredis.Redis.from_url(
        url, socket_timeout=max(1.0, timeout_s * 4), socket_connect_timeout=timeout_s
    )


async def redis_call(error: Callable[[str], Exception], call: Awaitable[R]) -> R:
    """What ``call`` returns; any Redis or socket failure raised as ``error``."""
    try:
        return await call
    except Exception as exc:  # any Redis/socket failure
        raise error(f"Redis: {type(exc).__name__}: {exc}") from exc


async def sqlite_call(
    error: Callable[[str], Exception], func: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> R:
    """``func`` run in a thread (SQLite blocks); a SQLite error raised as ``error``."""
    try:
        return await asyncio.to_thread(func, *args, **kwargs)
    except sqlite3.Error as exc:
        raise error(f"SQLite: {exc}") from exc
