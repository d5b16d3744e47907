"""Gateway state shared through Redis: API keys, canary weights, and the version counters that tell
every replica and worker when to drop what it cached.

Layout, under one prefix (``GATEWAY_REDIS_PREFIX``, default ``gw:``) so deployments can share a Redis:

- ``<p>keys:<key_id>`` (hash): one API key: name, key_hash, scopes (JSON), tier, created_at,
  rotated_at, revoked_at (empty string: never);
- ``<p>keys:index`` (sorted set): key ids scored by created_at, for listings (oldest first);
- ``<p>keys:version`` (integer): bumped, in the same transaction, by every change that can make a
  cached answer wrong: rotation, revocation, import. Creating a key bumps nothing: its id is new,
  so no process holds an answer about it;
- ``<p>traffic`` (hash): model -> JSON ``{version: weight}``, the canary weights;
- ``<p>traffic:version`` (integer): bumped by every weight change, in the same transaction;
- ``<p>traffic:outcomes:<model>`` (hash): ``answered <target>`` / ``failed <target>`` -> requests
  the model's weights routed there, added up by every process (deleted with the weights);
- ``<p>rl:<client>:<model>`` (string): rate-limit buckets (:mod:`gateway.tenancy.ratelimit`).

Other gateway data in Redis (usage metering, statistics) lives under the same prefix with names of
its own (``<p>usage:``, ``<p>stats:``).

Every change is one ``MULTI``/``EXEC`` transaction (``WATCH`` where it reads first) that also bumps
its version counter, so a reader that sees the new version also sees the change. The clients here
are blocking (``redis.Redis``): the same classes serve the CLI and, through ``asyncio.to_thread``
and only off the hot path, the gateway. Redis errors become :class:`KeyStoreUnavailable`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from gateway.tenancy.keys import (
    ApiKeyRecord,
    ImportResult,
    KeyStore,
    KeyStoreUnavailable,
    check_import,
    hash_key,
    new_key,
    plan_import,
)

if TYPE_CHECKING:
    from redis.client import Pipeline

__all__ = [
    "DEFAULT_PREFIX",
    "RedisKeyStore",
    "RedisTrafficStore",
    "StateVersions",
    "connect",
    "read_versions",
]

DEFAULT_PREFIX = "gw:"
T = TypeVar("T")


def connect(url: str, timeout_s: float) -> redis.Redis:
    """A blocking client with bounded connect and command timeouts (an outage must not stall callers)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry_on_timeout=False,
        decode_responses=True,
    )


@contextmanager
def _unavailable_on_error() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as exc:
        raise KeyStoreUnavailable(f"Redis is unreachable ({type(exc).__name__})") from exc


@dataclass(frozen=True)
class StateVersions:
    """The version counters: they change whenever keys / canary weights change."""

    keys: int
    traffic: int


def read_versions(client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> StateVersions:
    """Both counters in one round trip.

    Raises:
        KeyStoreUnavailable: Redis cannot be reached.
    """
    with _unavailable_on_error():
        keys, traffic = client.mget(prefix + "keys:version", prefix + "traffic:version")
    return StateVersions(int(keys or 0), int(traffic or 0))


def _optional(value: str | None) -> float | None:
    return float(value) if value else None


def _to_hash(record: ApiKeyRecord) -> dict[str, str]:
    return {
        "name": record.name,
        "key_hash": record.key_hash,
        "scopes": json.dumps(list(record.scopes)),
        "tier": record.tier,
        "created_at": repr(record.created_at),
        "rotated_at": "" if record.rotated_at is None else repr(record.rotated_at),
        "revoked_at": "" if record.revoked_at is None else repr(record.revoked_at),
    }


def _from_hash(key_id: str, fields: dict[str, str]) -> ApiKeyRecord | None:
    if not fields:
        return None
    return ApiKeyRecord(
        key_id=key_id,
        name=fields["name"],
        scopes=tuple(json.loads(fields["scopes"])),
        tier=fields["tier"],
        created_at=float(fields["created_at"]),
        rotated_at=_optional(fields.get("rotated_at")),
        revoked_at=_optional(fields.get("revoked_at")),
        key_hash=fields["key_hash"],
    )


class RedisKeyStore(KeyStore):
    """API keys in Redis, shared by every replica and worker using the same Redis and prefix.

    Args:
        url: a ``redis://`` URL.
        prefix: key namespace (see the module docstring).
        timeout_s: connect and command timeout.
    """

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX, timeout_s: float = 0.25) -> None:
        self._redis = connect(url, timeout_s)
        self._prefix = prefix
        self._index = prefix + "keys:index"
        self._version = prefix + "keys:version"

    def _key(self, key_id: str) -> str:
        return f"{self._prefix}keys:{key_id}"

    def _transaction(self, watch: Sequence[str], body: Callable[[Pipeline], T]) -> T:
        """Run ``body`` under WATCH/MULTI, retried when a watched key changed meanwhile."""
        with _unavailable_on_error():
            value = self._redis.transaction(body, *watch, value_from_callable=True)  # type: ignore[arg-type]
        return value  # type: ignore[return-value]

    def _write(self, pipe: Pipeline, record: ApiKeyRecord) -> None:
        pipe.hset(self._key(record.key_id), mapping=_to_hash(record))  # type: ignore[arg-type]
        pipe.zadd(self._index, {record.key_id: record.created_at})

    def _add_new(self, record: ApiKeyRecord) -> bool:
        def body(pipe: Pipeline) -> bool:
            if pipe.exists(self._key(record.key_id)):
                return False
            pipe.multi()
            self._write(pipe, record)  # no version bump: see the module docstring
            return True

        return self._transaction([self._key(record.key_id)], body)

    def get(self, key_id: str) -> ApiKeyRecord | None:
        with _unavailable_on_error():
            fields = self._redis.hgetall(self._key(key_id))
        return _from_hash(key_id, fields)  # type: ignore[arg-type]

    def list(self, include_revoked: bool = True) -> list[ApiKeyRecord]:
        with _unavailable_on_error():
            ids: list[str] = self._redis.zrange(self._index, 0, -1)  # type: ignore[assignment]
            pipe = self._redis.pipeline(transaction=False)
            for key_id in ids:
                pipe.hgetall(self._key(key_id))
            rows = pipe.execute()
        pairs = zip(ids, rows, strict=True)
        records = [r for r in (_from_hash(k, f) for k, f in pairs) if r]  # type: ignore[arg-type]
        return [r for r in records if include_revoked or not r.revoked]

    def rotate(self, key_id: str) -> str:
        _, plaintext = new_key(key_id)

        def body(pipe: Pipeline) -> bool:
            fields: dict[str, str] = pipe.hgetall(self._key(key_id))  # type: ignore[assignment]
            if not fields or fields.get("revoked_at"):
                return False
            pipe.multi()
            pipe.hset(
                self._key(key_id),
                mapping={"key_hash": hash_key(plaintext), "rotated_at": repr(time.time())},
            )
            pipe.incr(self._version)
            return True

        if not self._transaction([self._key(key_id)], body):
            raise KeyError(key_id)
        return plaintext

    def _mark_revoked(self, key_id: str) -> None:
        def body(pipe: Pipeline) -> bool:
            fields: dict[str, str] = pipe.hgetall(self._key(key_id))  # type: ignore[assignment]
            if not fields:
                return False
            if not fields.get("revoked_at"):  # idempotent: the first revocation's time stays
                pipe.multi()
                pipe.hset(self._key(key_id), "revoked_at", repr(time.time()))
                pipe.incr(self._version)
            return True

        if not self._transaction([self._key(key_id)], body):
            raise KeyError(key_id)

    def import_records(self, records: Sequence[ApiKeyRecord]) -> ImportResult:
        check_import(records)
        keys = [self._key(r.key_id) for r in records]

        def body(pipe: Pipeline) -> ImportResult:
            existing = {
                r.key_id: _from_hash(r.key_id, pipe.hgetall(k))  # type: ignore[arg-type]
                for r, k in zip(records, keys, strict=True)
            }
            write, skipped = plan_import(records, existing)
            pipe.multi()
            for record in write:
                self._write(pipe, record)
            if write:
                pipe.incr(self._version)
            return ImportResult([r.key_id for r in write], skipped)

        return self._transaction(keys, body)

    def close(self) -> None:
        self._redis.close()


class RedisTrafficStore:
    """Canary weights in Redis, as :class:`gateway.tenancy.traffic.TrafficSplit` persists them.

    Args:
        client: a client from :func:`connect`.
        prefix: key namespace.
    """

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self._redis = client
        self._hash = prefix + "traffic"
        self._version = prefix + "traffic:version"
        self._outcomes = prefix + "traffic:outcomes:"

    def load(self) -> dict[str, dict[str, float]]:
        """Every model's weights.

        Raises:
            KeyStoreUnavailable: Redis cannot be reached.
        """
        with _unavailable_on_error():
            raw: dict[str, Any] = self._redis.hgetall(self._hash)  # type: ignore[assignment]
        return {
            model: {str(v): float(w) for v, w in json.loads(doc).items()}
            for model, doc in raw.items()
        }

    def save(self, model: str, weights: dict[str, float]) -> None:
        """Set ``model``'s weights (already validated)."""
        with _unavailable_on_error():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hset(self._hash, model, json.dumps(weights))
            pipe.incr(self._version)
            pipe.execute()

    def delete(self, model: str) -> bool:
        """Unpin ``model`` and forget its outcome counts; ``False`` when nothing was set."""
        with _unavailable_on_error():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hdel(self._hash, model)
            pipe.delete(self._outcomes + model)
            pipe.incr(self._version)
            removed, _, _ = pipe.execute()
        return bool(removed)

    def add_outcomes(self, counts: dict[str, dict[str, list[int]]]) -> None:
        """Add one process's outcome counts (model -> target -> [answered, failed])."""
        with _unavailable_on_error():
            pipe = self._redis.pipeline(transaction=False)
            for model, targets in counts.items():
                for target, (answered, failed) in targets.items():
                    if answered:
                        pipe.hincrby(self._outcomes + model, f"answered {target}", answered)
                    if failed:
                        pipe.hincrby(self._outcomes + model, f"failed {target}", failed)
            pipe.execute()

    def outcomes(self, model: str) -> dict[str, list[int]]:
        """Every process's outcome counts for ``model``: target -> [answered, failed]."""
        with _unavailable_on_error():
            raw: dict[str, Any] = self._redis.hgetall(self._outcomes + model)  # type: ignore[assignment]
        counts: dict[str, list[int]] = {}
        for field, value in raw.items():
            kind, _, target = field.partition(" ")
            counts.setdefault(target, [0, 0])[0 if kind == "answered" else 1] += int(value)
        return counts
