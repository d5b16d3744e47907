"""Usage metering per API key, as a platform bills: per client, model and UTC day.

Counted for every request that was admitted (it passed scope and rate limits and reached Triton),
whatever the client's tier, unlimited tiers included:

==============  ==================================================================================
``requests``    admitted requests answered successfully
``failed``      admitted requests that ended in an error (4xx/5xx after admission)
``images``      images classified (``/v1/classify``) or generated (``/v1/images/generations``)
``inputs``      texts embedded (``/v1/embeddings``)
``tokens``      tokens the embedding model's tokenizer produced for those texts (special tokens
                included), as Triton's ``text_embedding`` reports them in its ``TOKENS`` output
``compute_us``  time the gateway waited on Triton for the request, in microseconds (successful or not)
==============  ==================================================================================

Counts accumulate in the process and are flushed to the store every ``usage_flush_interval_s``
(adds, never overwrites: Redis ``HINCRBY`` or a SQLite upsert that adds, so replicas and workers
sum up), exactly once (each batch has an id the store remembers; see :meth:`UsageMeter.flush`). A
process that dies loses at most that interval's counts. Stores (:mod:`gateway.tenancy.usage_store`):
Redis when configured, else a SQLite file next to the key store.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Protocol

__all__ = [
    "METRICS",
    "RequestUsage",
    "UsageMeter",
    "UsageRow",
    "UsageStore",
    "UsageStoreError",
    "day_of",
]

log = logging.getLogger(__name__)

METRICS = ("requests", "failed", "images", "inputs", "tokens", "compute_us")


class UsageStoreError(Exception):
    """The usage store could not be read or written (translated from Redis/SQLite errors)."""


@dataclass
class RequestUsage:
    """What one request consumed; filled in by the service, read when the request finishes.

    The time it waited on Triton is its ``upstream`` stage (:mod:`gateway.observe.timing`).
    """

    images: int = 0
    inputs: int = 0
    tokens: int = 0


@dataclass
class UsageRow:
    """Usage of one client on one model on one UTC day."""

    day: str
    client: str
    model: str
    requests: int = 0
    failed: int = 0
    images: int = 0
    inputs: int = 0
    tokens: int = 0
    compute_us: int = 0

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in METRICS}

    def add(self, counts: dict[str, int]) -> None:
        for name, value in counts.items():
            setattr(self, name, getattr(self, name) + value)


_KEY_FIELDS = {"day", "client", "model"}
assert tuple(f.name for f in fields(UsageRow) if f.name not in _KEY_FIELDS) == METRICS


def day_of(wall_time: float) -> str:
    """The UTC day (``YYYY-MM-DD``) of a Unix time: usage days are UTC everywhere."""
    return dt.datetime.fromtimestamp(wall_time, dt.UTC).date().isoformat()


class UsageStore(Protocol):
    """Where processes add their usage counts up."""

    async def add(self, batch: str, rows: list[UsageRow]) -> None:
        """Add these counts to the stored ones, unless batch ``batch`` was added before.

        Raises:
            UsageStoreError: the store failed or did not answer (the batch may have been applied:
                send it again with the same id).
        """

    async def read(self, first_day: str, last_day: str, client: str | None) -> list[UsageRow]:
        """Stored rows for days in ``[first_day, last_day]`` (one client's, or everyone's).

        Raises:
            UsageStoreError: the store failed.
        """

    async def close(self) -> None: ...


@dataclass
class UsageMeter:
    """Counts usage in the process and flushes it to the store.

    Args:
        store: the shared store (attached by the app's lifespan; counts wait in memory until then).
    """

    store: UsageStore | None = None
    _pending: dict[tuple[str, str, str], UsageRow] = field(default_factory=dict, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _today: tuple[float, float, str] = field(default=(0.0, 0.0, ""), repr=False)
    _unconfirmed: tuple[str, list[UsageRow]] | None = field(default=None, repr=False)

    def _day(self, wall_time: float) -> str:
        start, end, day = self._today
        if not start <= wall_time < end:  # formatting a date per request costs more than the rest
            start = wall_time - wall_time % 86_400
            day = day_of(start)
            self._today = (start, start + 86_400, day)
        return day

    def record(
        self,
        client: str,
        model: str,
        status: int,
        usage: RequestUsage,
        upstream_s: float,
        now: float | None = None,
    ) -> None:
        """One admitted request, once it is answered.

        Args:
            client: the caller's public id.
            model: the (admitted) model.
            status: the HTTP status answered.
            usage: what the request consumed.
            upstream_s: the time it waited on Triton (its ``upstream`` stage).
            now: wall-clock time (default: now).
        """
        day = self._day(time.time() if now is None else now)
        row = self._pending.get((day, client, model))
        if row is None:
            row = self._pending[(day, client, model)] = UsageRow(day, client, model)
        row.compute_us += round(upstream_s * 1_000_000)
        if status >= 400:
            row.failed += 1
            return
        row.requests += 1
        row.images += usage.images
        row.inputs += usage.inputs
        row.tokens += usage.tokens

    async def flush(self) -> None:
        """Add the pending counts to the store, exactly once.

        Each batch carries an id the store remembers, and a batch that failed is sent again as it
        was, with the same id, before any newer counts: a store that applied it but whose answer
        was lost (a Redis that hung, then caught up with what it had buffered) skips it the second
        time instead of counting it twice.

        Raises:
            UsageStoreError: the store failed (the counts are kept for the next flush).
        """
        async with self._lock:  # one flush at a time
            if self.store is None:
                return
            if self._unconfirmed is not None:
                await self.store.add(*self._unconfirmed)
                self._unconfirmed = None
            if not self._pending:
                return
            self._unconfirmed = (uuid.uuid4().hex, list(self._pending.values()))
            self._pending = {}
            await self.store.add(*self._unconfirmed)
            self._unconfirmed = None

    async def flush_forever(self, interval_s: float) -> None:
        """Flush every ``interval_s`` until cancelled (a lifespan task); failures are logged."""
        failing = False
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush()
            except UsageStoreError as exc:
                if not failing:  # once per outage, not once per interval
                    log.warning(
                        "usage metering: flushing to the store failed (%s); counts kept, retrying",
                        exc,
                    )
                failing = True
                continue
            if failing:
                log.warning("usage metering: flushing to the store works again")
            failing = False

    async def read(self, first_day: str, last_day: str, client: str | None) -> list[UsageRow]:
        """The stored usage (this process's pending counts flushed first, so they are included).

        Raises:
            UsageStoreError: the store failed.
        """
        await self.flush()
        if self.store is None:
            raise UsageStoreError("no usage store is attached")
        rows = await self.store.read(first_day, last_day, client)
        return sorted(rows, key=lambda r: (r.day, r.client, r.model))
