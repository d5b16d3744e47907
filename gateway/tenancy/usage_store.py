"""Where usage counts add up: Redis (replicas) or a SQLite file (one host).

Redis, under the gateway's key prefix:

=============================  =====  ===========================================================
key                            type   holds
=============================  =====  ===========================================================
``<p>usage:<day>:<client>``    hash   ``<model>:<metric>`` -> integer count (``HINCRBY``)
``<p>usage:<day>:clients``     set    clients with usage that day (for the admin's listing)
=============================  =====  ===========================================================

``<p>usage:batch:<id>`` marks a flushed batch for :data:`BATCH_MEMORY_S`. One flush is one Lua
script that sets the marker and adds the counts, so it is applied whole, and only once however often
it is sent again; the usage keys expire ``retention_days`` after their day. SQLite: one table, one
upsert per row that adds to the stored counts, and the batch marker, in one transaction per flush
(safe for several processes; WAL).
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import time
from pathlib import Path

from gateway.observe.redis_series import read_client_hashes
from gateway.observe.store_calls import open_redis, redis_call, sqlite_call
from gateway.tenancy.private_files import create_private
from gateway.tenancy.usage import METRICS, UsageRow, UsageStoreError

__all__ = ["BATCH_MEMORY_S", "RedisUsageStore", "SqliteUsageStore", "days_between"]

DEFAULT_RETENTION_DAYS = 400


def days_between(first_day: str, last_day: str) -> list[str]:
    """Every UTC day from ``first_day`` to ``last_day`` (``YYYY-MM-DD``, inclusive)."""
    first, last = dt.date.fromisoformat(first_day), dt.date.fromisoformat(last_day)
    return [(first + dt.timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


#: how long a store remembers an applied batch id (a flush is retried every interval until it lands)
BATCH_MEMORY_S = 2 * 86_400

# KEYS[1] the batch marker, then per row its usage hash and its day's client set.
# ARGV: marker lifetime, JSON per row [field, amount, ...], JSON expiry per row, JSON client per row.
# One script: applied whole, and only once per batch id.
_ADD_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
local counts = cjson.decode(ARGV[2])
local expiry = cjson.decode(ARGV[3])
local clients = cjson.decode(ARGV[4])
for i = 1, #counts do
  local hash, members = KEYS[2 * i], KEYS[2 * i + 1]
  local fields = counts[i]
  for j = 1, #fields, 2 do redis.call('HINCRBY', hash, fields[j], fields[j + 1]) end
  redis.call('EXPIREAT', hash, expiry[i])
  redis.call('SADD', members, clients[i])
  redis.call('EXPIREAT', members, expiry[i])
end
return 1
"""


class RedisUsageStore:
    """Usage counters in Redis (see the module docstring).

    Args:
        url: a ``redis://`` URL.
        prefix: key namespace shared with the gateway's other Redis data.
        timeout_s: connect timeout (commands get a little more: a flush is one round trip of many).
        retention_days: how long a day's counts are kept.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gw:",
        timeout_s: float = 0.25,
        retention_days: int = DEFAULT_RETENTION_DAYS,
    ) -> None:
        self._redis = open_redis(url, timeout_s)
        self._prefix = f"{prefix}usage:"
        self._retention_s = retention_days * 86_400
        self._add = self._redis.register_script(_ADD_LUA)

    def _expiry(self, day: str) -> int:
        end = dt.datetime.combine(dt.date.fromisoformat(day), dt.time(), dt.UTC) + dt.timedelta(
            days=1
        )
        return int(end.timestamp()) + self._retention_s

    async def add(self, batch: str, rows: list[UsageRow]) -> None:
        keys = [f"{self._prefix}batch:{batch}"]
        counts, expiry, clients = [], [], []
        for row in rows:
            keys += [f"{self._prefix}{row.day}:{row.client}", f"{self._prefix}{row.day}:clients"]
            fields: list[str | int] = []
            for name, value in row.counts().items():
                if value:
                    fields += [f"{row.model}:{name}", value]
            counts.append(fields)
            expiry.append(self._expiry(row.day))
            clients.append(row.client)
        args: list[str | int] = [
            BATCH_MEMORY_S,
            json.dumps(counts),
            json.dumps(expiry),
            json.dumps(clients),
        ]
        await redis_call(UsageStoreError, self._add(keys=keys, args=args))

    async def read(self, first_day: str, last_day: str, client: str | None) -> list[UsageRow]:
        days = days_between(first_day, last_day)
        series = await redis_call(
            UsageStoreError,
            read_client_hashes(
                self._redis,
                days,
                client,
                lambda day: f"{self._prefix}{day}:clients",
                lambda day, owner: f"{self._prefix}{day}:{owner}",
            ),
        )
        rows: dict[tuple[str, str, str], UsageRow] = {}
        for day, owner, counts in series:
            for raw_field, raw_value in counts.items():
                text = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
                model, _, metric = text.rpartition(":")
                if metric not in METRICS or not model:
                    continue
                row = rows.setdefault((day, owner, model), UsageRow(day, owner, model))
                row.add({metric: int(raw_value)})
        return list(rows.values())

    async def close(self) -> None:
        await self._redis.aclose()


_COLUMNS = ", ".join(METRICS)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS usage (
    day     TEXT NOT NULL,
    client  TEXT NOT NULL,
    model   TEXT NOT NULL,
    {", ".join(f"{name} INTEGER NOT NULL DEFAULT 0" for name in METRICS)},
    PRIMARY KEY (day, client, model)
)
"""
_UPSERT = (
    f"INSERT INTO usage (day, client, model, {_COLUMNS}) VALUES (?, ?, ?, {', '.join('?' for _ in METRICS)}) "
    f"ON CONFLICT (day, client, model) DO UPDATE SET "
    + ", ".join(f"{name} = {name} + excluded.{name}" for name in METRICS)
)


class SqliteUsageStore:
    """Usage counters in a SQLite file shared by the processes of one host.

    Args:
        path: the database file (created with its folder), on a local disk.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        create_private(self.path)  # key hashes / tenants' data: mode 0600
        db = self._connect()
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            db.execute(
                "CREATE TABLE IF NOT EXISTS usage_batches (batch TEXT PRIMARY KEY, at REAL NOT NULL)"
            )
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=5.0)

    def _add(self, batch: str, rows: list[UsageRow]) -> None:
        db = self._connect()
        try:
            with db:  # one transaction: the batch marker and all rows, or nothing
                now = time.time()
                fresh = db.execute(
                    "INSERT OR IGNORE INTO usage_batches VALUES (?, ?)", (batch, now)
                ).rowcount
                if fresh:
                    db.executemany(
                        _UPSERT, [(r.day, r.client, r.model, *r.counts().values()) for r in rows]
                    )
                db.execute("DELETE FROM usage_batches WHERE at < ?", (now - BATCH_MEMORY_S,))
        finally:
            db.close()

    def _read(self, first_day: str, last_day: str, client: str | None) -> list[UsageRow]:
        query = f"SELECT day, client, model, {_COLUMNS} FROM usage WHERE day >= ? AND day <= ?"
        args = [first_day, last_day]
        if client is not None:
            query += " AND client = ?"
            args.append(client)
        db = self._connect()
        try:
            return [UsageRow(*row) for row in db.execute(query, args).fetchall()]
        finally:
            db.close()

    async def add(self, batch: str, rows: list[UsageRow]) -> None:
        await sqlite_call(UsageStoreError, self._add, batch, rows)

    async def read(self, first_day: str, last_day: str, client: str | None) -> list[UsageRow]:
        return await sqlite_call(UsageStoreError, self._read, first_day, last_day, client)

    async def close(self) -> None:
        return None
