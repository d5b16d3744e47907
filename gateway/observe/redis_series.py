"""Reading per-period Redis hashes of one client or of every client: shared by the latency sketches
(:mod:`gateway.observe.stats_store`) and usage metering (:mod:`gateway.tenancy.usage_store`).

Both stores keep, per period (a time bucket, a day), one hash per client and a set naming the
clients that wrote in it; a reader asks for one client's hashes or, as the admin, for everyone's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["read_client_hashes"]

P = TypeVar("P")


async def read_client_hashes(
    redis: Any,
    periods: Sequence[P],
    client: str | None,
    clients_key: Callable[[P], str],
    hash_key: Callable[[P, str], str],
) -> list[tuple[P, str, dict[Any, Any]]]:
    """``(period, client, hash)`` for ``client`` in every period, or (``client`` None) for every client
    the period's set names, in two pipelined round trips. Redis errors propagate to the store."""
    if client is None:
        pipe = redis.pipeline(transaction=False)
        for period in periods:
            pipe.smembers(clients_key(period))
        members = await pipe.execute()
        wanted = [
            (period, c.decode() if isinstance(c, bytes) else c)
            for period, clients in zip(periods, members, strict=True)
            for c in sorted(clients)
        ]
    else:
        wanted = [(period, client) for period in periods]
    pipe = redis.pipeline(transaction=False)
    for period, owner in wanted:
        pipe.hgetall(hash_key(period, owner))
    hashes = await pipe.execute()
    return [(period, owner, fields) for (period, owner), fields in zip(wanted, hashes, strict=True)]
