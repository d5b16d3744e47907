"""Where processes share their latency sketches, so ``/v1/stats`` covers every worker and replica.

Each gateway process records into its own :class:`gateway.observe.latency.LatencyWindows` and, every
``stats_publish_interval_s``, publishes the sketches that changed (each one its bucket's total so
far, written over the previous copy, so publishing twice never counts twice). A read merges this
process's live sketches with what every *other* process published for the window.

Two shared stores, one interface (:class:`SketchStore`):

- :class:`RedisSketchStore` when ``GATEWAY_REDIS_URL`` is set (replicas on several hosts):

  ==================================  =====  ==============================================
  key                                 type   holds
  ==================================  =====  ==============================================
  ``<p>stats:<bucket>:clients``       set    client ids with a sketch in this bucket
  ``<p>stats:<bucket>:c:<client>``    hash   ``<process>:<model>`` -> sketch bytes
  ==================================  =====  ==============================================

  Both expire (``EXPIREAT``) once the bucket has left every window. A client's read touches only
  its own hashes.
- :class:`SqliteSketchStore` (``GATEWAY_STATS_DB``) for several workers on one host without Redis:
  one table in a SQLite file (WAL, an upsert per sketch), rows older than the window deleted.

Without either, each process reports its own traffic only (right for the single-process default).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.observe.latency import BucketEntry
from gateway.observe.redis_series import read_client_hashes
from gateway.observe.store_calls import open_redis, redis_call, sqlite_call

__all__ = [
    "EncodedEntry",
    "RedisSketchStore",
    "SketchStore",
    "SqliteSketchStore",
    "StatsStoreError",
]

log = logging.getLogger(__name__)


class StatsStoreError(Exception):
    """The shared store could not be read or written (translated from Redis/SQLite errors)."""


class SketchStore(Protocol):
    """A place where processes publish and read latency sketches."""

    async def publish(
        self, process: str, entries: Sequence[BucketEntry], expires_at: Mapping[int, float]
    ) -> None:
        """Write (over) ``process``'s sketches; ``expires_at`` maps each bucket to the Unix time after
        which no window covers it.

        Raises:
            StatsStoreError: the store failed.
        """

    async def read(
        self, buckets: range, client: str | None, exclude_process: str
    ) -> list[EncodedEntry]:
        """Every other process's sketches in ``buckets`` (only ``client``'s when given), still encoded
        (merging encoded sketches is far cheaper than decoding each, see ``LatencySketch.merged``).

        Raises:
            StatsStoreError: the store failed.
        """

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EncodedEntry:
    """One published sketch as read back: its series and its ``LatencySketch.to_bytes`` encoding."""

    model: str
    client: str
    blob: bytes


def _split_field(field: bytes | str) -> tuple[str, str]:
    text = field.decode() if isinstance(field, bytes) else field
    process, _, model = text.partition(":")
    return process, model


class RedisSketchStore:
    """Sketches in Redis (see the module docstring for the layout).

    Args:
        url: a ``redis://`` URL.
        prefix: key namespace shared with the gateway's other Redis data.
        timeout_s: connect and command timeout.
    """

    def __init__(self, url: str, *, prefix: str = "gw:", timeout_s: float = 0.25) -> None:
        self._redis = open_redis(url, timeout_s)
        self._prefix = f"{prefix}stats:"

    def _clients_key(self, bucket: int) -> str:
        return f"{self._prefix}{bucket}:clients"

    def _series_key(self, bucket: int, client: str) -> str:
        return f"{self._prefix}{bucket}:c:{client}"

    async def publish(
        self, process: str, entries: Sequence[BucketEntry], expires_at: Mapping[int, float]
    ) -> None:
        pipe = self._redis.pipeline(transaction=False)
        touched: set[tuple[int, str]] = set()
        for entry in entries:
            pipe.hset(
                self._series_key(entry.bucket, entry.client),
                f"{process}:{entry.model}",
                entry.sketch.to_bytes(),
            )
            touched.add((entry.bucket, entry.client))
        for bucket, client in touched:
            when = math.ceil(expires_at[bucket])
            pipe.sadd(self._clients_key(bucket), client)
            pipe.expireat(self._clients_key(bucket), when)
            pipe.expireat(self._series_key(bucket, client), when)
        await redis_call(StatsStoreError, pipe.execute())

    async def read(
        self, buckets: range, client: str | None, exclude_process: str
    ) -> list[EncodedEntry]:
        series = await redis_call(
            StatsStoreError,
            read_client_hashes(self._redis, buckets, client, self._clients_key, self._series_key),
        )
        out = []
        for _, owner, fields in series:
            for field, value in fields.items():
                process, model = _split_field(field)
                if model and process != exclude_process:
                    out.append(EncodedEntry(model, owner, bytes(value)))
        return out

    async def close(self) -> None:
        await self._redis.aclose()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS latency_sketches (
    bucket   INTEGER NOT NULL,
    client   TEXT NOT NULL,
    model    TEXT NOT NULL,
    process  TEXT NOT NULL,
    expires  REAL NOT NULL,
    sketch   BLOB NOT NULL,
    PRIMARY KEY (bucket, client, model, process)
)
"""


class SqliteSketchStore:
    """Sketches in a SQLite file shared by the processes of one host.

    Args:
        path: the database file (created with its folder); must be on a local disk (SQLite's WAL
            needs shared memory between the processes).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = self._connect()
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=5.0)

    def _publish(
        self, process: str, entries: Sequence[BucketEntry], expires_at: Mapping[int, float]
    ) -> None:
        rows = [
            (e.bucket, e.client, e.model, process, expires_at[e.bucket], e.sketch.to_bytes())
            for e in entries
        ]
        db = self._connect()
        try:
            with db:
                db.executemany(
                    "INSERT INTO latency_sketches VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT "
                    "(bucket, client, model, process) DO UPDATE SET sketch = excluded.sketch, "
                    "expires = excluded.expires",
                    rows,
                )
                db.execute("DELETE FROM latency_sketches WHERE expires < ?", (time.time(),))
        finally:
            db.close()

    def _read(self, buckets: range, client: str | None, exclude_process: str) -> list[EncodedEntry]:
        query = (
            "SELECT client, model, sketch FROM latency_sketches "
            "WHERE bucket >= ? AND bucket < ? AND process != ?"
        )
        args: list[object] = [buckets.start, buckets.stop, exclude_process]
        if client is not None:
            query += " AND client = ?"
            args.append(client)
        db = self._connect()
        try:
            rows = db.execute(query, args).fetchall()
        finally:
            db.close()
        return [EncodedEntry(model, owner, bytes(blob)) for owner, model, blob in rows]

    async def publish(
        self, process: str, entries: Sequence[BucketEntry], expires_at: Mapping[int, float]
    ) -> None:
        await sqlite_call(StatsStoreError, self._publish, process, entries, expires_at)

    async def read(
        self, buckets: range, client: str | None, exclude_process: str
    ) -> list[EncodedEntry]:
        return await sqlite_call(StatsStoreError, self._read, buckets, client, exclude_process)

    async def close(self) -> None:
        return None
