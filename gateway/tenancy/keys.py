"""API keys: only a SHA-256 of each key is stored, compared in constant time.

A key looks like ``gk_<key_id>_<secret>``: ``key_id`` is a short public id (shown in listings,
logs and metrics labels), ``secret`` 32 random bytes (256 bits) from :mod:`secrets`. Because the
secret is high-entropy a plain SHA-256 is enough (a slow password hash protects low-entropy
passwords, not random tokens) and keeps verification in microseconds on the request path.

Two stores behind one interface, :class:`KeyStore`:

- :class:`gateway.tenancy.keys_sqlite.SqliteKeyStore`: a file, the single-process default (``inferctl up``).
- :class:`gateway.tenancy.redis_state.RedisKeyStore`: shared by every replica and worker; chosen whenever a
  Redis URL is configured (:func:`gateway.tenancy.key_stores.open_key_store`).

Keys move between stores as :class:`ApiKeyRecord` documents (id, hash and metadata, never a
plaintext): ``export`` from one, :meth:`KeyStore.import_records` into the other.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ParamSpec, TypeVar

from gateway.errors import StateStoreUnavailable

__all__ = [
    "ALL_MODELS",
    "KEY_ID_PATTERN",
    "KEY_HASH_PATTERN",
    "KEY_PREFIX",
    "ApiKeyRecord",
    "ImportResult",
    "KeyConflict",
    "KeyStore",
    "KeyStoreUnavailable",
    "hash_key",
    "in_store_thread",
    "new_key",
    "parse_key",
]

KEY_PREFIX = "gk_"
ALL_MODELS = "*"
_ID_BYTES = 6  # 12 hex chars: public, only has to be unique
_SECRET_BYTES = 32
KEY_ID_PATTERN = r"^[0-9a-f]{12}$"
KEY_HASH_PATTERN = r"^[0-9a-f]{64}$"
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class ApiKeyRecord:
    """One stored key, without its secret.

    Attributes:
        key_id: the public id (part of the key itself).
        name: a label chosen by the admin.
        scopes: model names the key may call, or ``["*"]`` for every model.
        tier: the rate-limit tier.
        created_at / rotated_at / revoked_at: Unix times (``None`` when it never happened).
        key_hash: SHA-256 (hex) of the plaintext key.
    """

    key_id: str
    name: str
    scopes: tuple[str, ...]
    tier: str
    created_at: float
    rotated_at: float | None
    revoked_at: float | None
    key_hash: str = ""

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def allows(self, model: str) -> bool:
        """Whether this key's scopes cover ``model``."""
        return ALL_MODELS in self.scopes or model in self.scopes

    def as_export(self) -> dict[str, Any]:
        """The record as an export document entry (what :meth:`KeyStore.import_records` takes back)."""
        out = asdict(self)
        out["scopes"] = list(self.scopes)
        return out


@dataclass(frozen=True)
class ImportResult:
    """What an import did: ids written, and ids already present with identical content."""

    imported: list[str]
    skipped: list[str]


class KeyConflict(Exception):
    """An imported id exists in the store with a different hash or metadata; nothing was written."""

    def __init__(self, key_ids: Sequence[str]) -> None:
        super().__init__(f"key ids already present with different content: {', '.join(key_ids)}")
        self.key_ids = list(key_ids)


class KeyStoreUnavailable(Exception):
    """The store could not be reached (Redis down); raised with the library error as its cause."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(key_id: str | None = None) -> tuple[str, str]:
    """A fresh ``(key_id, plaintext)``; the id is kept when given (rotation)."""
    key_id = key_id or secrets.token_hex(_ID_BYTES)
    return key_id, f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"


def parse_key(key: str) -> str | None:
    """The public key id inside a presented key, or ``None`` if it is not shaped like one of ours.

    Args:
        key: the plaintext key a client sent.

    Returns:
        The ``key_id`` part.
    """
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX) :].partition("_")
    if not sep or len(key_id) != 2 * _ID_BYTES or not secret:
        return None
    return key_id


_DUMMY_HASH = hash_key("gk_000000000000_dummy")


def check_import(records: Sequence[ApiKeyRecord]) -> None:
    """Refuse an import batch that is malformed before any store is touched.

    Raises:
        ValueError: an id or hash that is not of our shape, no scopes, or an id given twice.
    """
    seen: set[str] = set()
    for record in records:
        if not re.match(KEY_ID_PATTERN, record.key_id):
            raise ValueError(f"key_id {record.key_id!r} is not 12 lower-case hex characters")
        if not re.match(KEY_HASH_PATTERN, record.key_hash):
            raise ValueError(f"key_hash of {record.key_id} is not a lower-case hex SHA-256")
        if not record.scopes:
            raise ValueError(f"key {record.key_id} has no scopes")
        if record.key_id in seen:
            raise ValueError(f"key_id {record.key_id} appears twice")
        seen.add(record.key_id)


def plan_import(
    records: Sequence[ApiKeyRecord], existing: dict[str, ApiKeyRecord | None]
) -> tuple[list[ApiKeyRecord], list[str]]:
    """Split an import into records to write and ids to skip (identical copies already present).

    Raises:
        KeyConflict: some ids exist with other content; the caller writes nothing.
    """
    write, skipped, conflicts = [], [], []
    for record in records:
        current = existing.get(record.key_id)
        if current is None:
            write.append(record)
        elif current == record:
            skipped.append(record.key_id)
        else:
            conflicts.append(record.key_id)
    if conflicts:
        raise KeyConflict(conflicts)
    return write, skipped


class KeyStore(ABC):
    """Where API keys live. Every method is blocking I/O: async callers use ``asyncio.to_thread``.

    Store errors surface as :class:`KeyStoreUnavailable`; a missing key as ``KeyError``.
    """

    def create(
        self, name: str, scopes: Sequence[str] = (ALL_MODELS,), tier: str = "free"
    ) -> tuple[str, str]:
        """Create a key.

        Args:
            name: a label for humans.
            scopes: model names, or ``["*"]``.
            tier: the rate-limit tier.

        Returns:
            ``(key_id, plaintext_key)``. The plaintext is not stored: show it once.

        Raises:
            ValueError: ``scopes`` is empty.
        """
        if not scopes:
            raise ValueError("a key needs at least one scope (a model name or '*')")
        for _ in range(5):  # an id collision is astronomically rare; retry rather than fail
            key_id, plaintext = new_key()
            record = ApiKeyRecord(
                key_id, name, tuple(scopes), tier, time.time(), None, None, hash_key(plaintext)
            )
            if self._add_new(record):
                return key_id, plaintext
        raise RuntimeError("could not allocate a unique key id")

    @abstractmethod
    def _add_new(self, record: ApiKeyRecord) -> bool:
        """Store a new ``record``; ``False`` (nothing written) when its id is taken."""

    @abstractmethod
    def get(self, key_id: str) -> ApiKeyRecord | None:
        """The record for ``key_id`` (revoked ones included), or ``None``."""

    @abstractmethod
    def list(self, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """Every key, oldest first."""

    @abstractmethod
    def rotate(self, key_id: str) -> str:
        """Give ``key_id`` a new secret; the old one stops working.

        Returns:
            The new plaintext key (same id, scopes and tier).

        Raises:
            KeyError: no such unrevoked key.
        """

    def revoke(self, key_id: str) -> ApiKeyRecord:
        """Revoke ``key_id`` (idempotent: revoking twice keeps the first time).

        Raises:
            KeyError: no such key.
        """
        self._mark_revoked(key_id)
        record = self.get(key_id)
        if record is None:
            raise KeyError(key_id)
        return record

    @abstractmethod
    def _mark_revoked(self, key_id: str) -> None:
        """Stamp ``key_id`` revoked now unless it already is (a missing key: nothing, or ``KeyError``)."""

    @abstractmethod
    def import_records(self, records: Sequence[ApiKeyRecord]) -> ImportResult:
        """Add keys exported from another store, all or nothing.

        An id already present with identical content is skipped (an import can be re-run).

        Raises:
            ValueError: a malformed record (see :func:`check_import`).
            KeyConflict: an id is present with other content; nothing was written.
        """

    def close(self) -> None:  # noqa: B027 - optional hook: SQLite holds nothing open
        """Release connections."""

    @staticmethod
    def matches(record: ApiKeyRecord | None, plaintext: str) -> bool:
        """Whether ``plaintext`` is the key ``record`` stores, in constant time.

        A missing record still costs one comparison, so timing does not reveal which ids exist.
        """
        candidate = hash_key(plaintext)
        expected = record.key_hash if record is not None else _DUMMY_HASH
        return hmac.compare_digest(candidate, expected) and record is not None

    def verify(self, plaintext: str) -> ApiKeyRecord | None:
        """The active record for a presented key, or ``None`` if it is unknown, wrong or revoked."""
        key_id = parse_key(plaintext)
        record = self.get(key_id) if key_id else None
        if not self.matches(record, plaintext) or record is None or record.revoked:
            return None
        return record


def records_from_export(entries: Iterable[dict[str, Any]]) -> list[ApiKeyRecord]:
    """Export document entries back into records.

    Raises:
        ValueError: an entry lacks a field or has one of the wrong type.
    """
    out = []
    for index, entry in enumerate(entries):
        try:
            out.append(
                ApiKeyRecord(
                    key_id=str(entry["key_id"]),
                    name=str(entry["name"]),
                    scopes=tuple(str(s) for s in entry["scopes"]),
                    tier=str(entry["tier"]),
                    created_at=float(entry["created_at"]),
                    rotated_at=None
                    if entry.get("rotated_at") is None
                    else float(entry["rotated_at"]),
                    revoked_at=None
                    if entry.get("revoked_at") is None
                    else float(entry["revoked_at"]),
                    key_hash=str(entry["key_hash"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"keys[{index}]: {type(exc).__name__}: {exc}") from exc
    return out


async def in_store_thread(
    outage: str, func: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> R:
    """Run a blocking store call off the event loop; an unreachable store is a 503 that starts with
    ``outage``."""
    try:
        return await asyncio.to_thread(func, *args, **kwargs)
    except KeyStoreUnavailable as exc:
        raise StateStoreUnavailable(f"{outage}: {exc}", retry_after_s=1) from exc
