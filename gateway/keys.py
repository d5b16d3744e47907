"""API keys in SQLite: only a SHA-256 of each key is stored, compared in constant time.

A key looks like ``gk_<key_id>_<secret>``: ``key_id`` is a short public id (shown in listings,
logs and metrics labels), ``secret`` 32 random bytes (256 bits) from :mod:`secrets`. Because the
secret is high-entropy a plain SHA-256 is enough (a slow password hash protects low-entropy
passwords, not random tokens) and keeps verification in microseconds on the request path.

The store is safe for several processes (SQLite WAL mode, short transactions); each call opens its
own connection, so no connection is shared across threads or event loops.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

__all__ = ["ALL_MODELS", "KEY_PREFIX", "ApiKeyRecord", "KeyStore", "bootstrap_first_key", "parse_key"]

KEY_PREFIX = "gk_"
ALL_MODELS = "*"
_ID_BYTES = 6  # 12 hex chars: public, only has to be unique
_SECRET_BYTES = 32

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    key_hash    TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    tier        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    rotated_at  REAL,
    revoked_at  REAL
)
"""


@dataclass(frozen=True)
class ApiKeyRecord:
    """One stored key, without its secret.

    Attributes:
        key_id: the public id (part of the key itself).
        name: a label chosen by the admin.
        scopes: model names the key may call, or ``["*"]`` for every model.
        tier: the rate-limit tier.
        created_at / rotated_at / revoked_at: Unix times (``None`` when it never happened).
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


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


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


_DUMMY_HASH = _hash("gk_000000000000_dummy")


class KeyStore:
    """SQLite-backed API keys.

    Args:
        path: the database file; created (with its parent directory) if missing.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            yield db
        finally:
            db.close()

    @staticmethod
    def _record(row: sqlite3.Row) -> ApiKeyRecord:
        return ApiKeyRecord(
            key_id=row["key_id"],
            name=row["name"],
            scopes=tuple(json.loads(row["scopes"])),
            tier=row["tier"],
            created_at=row["created_at"],
            rotated_at=row["rotated_at"],
            revoked_at=row["revoked_at"],
            key_hash=row["key_hash"],
        )

    def create(self, name: str, scopes: Sequence[str] = (ALL_MODELS,), tier: str = "free") -> tuple[str, str]:
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
            key_id = secrets.token_hex(_ID_BYTES)
            plaintext = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
            try:
                with self._connect() as db:
                    db.execute(
                        "INSERT INTO api_keys (key_id, name, key_hash, scopes, tier, created_at) VALUES (?,?,?,?,?,?)",
                        (key_id, name, _hash(plaintext), json.dumps(list(scopes)), tier, time.time()),
                    )
            except sqlite3.IntegrityError:
                continue
            return key_id, plaintext
        raise RuntimeError("could not allocate a unique key id")

    def get(self, key_id: str) -> ApiKeyRecord | None:
        """The record for ``key_id`` (revoked ones included), or ``None``."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return self._record(row) if row else None

    def list(self, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """Every key, oldest first."""
        query = "SELECT * FROM api_keys" + ("" if include_revoked else " WHERE revoked_at IS NULL")
        with self._connect() as db:
            return [self._record(r) for r in db.execute(query + " ORDER BY created_at")]

    def rotate(self, key_id: str) -> str:
        """Give ``key_id`` a new secret; the old one stops working.

        Args:
            key_id: an existing, unrevoked key.

        Returns:
            The new plaintext key (same id, scopes and tier).

        Raises:
            KeyError: no such unrevoked key.
        """
        plaintext = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
        with self._connect() as db:
            cursor = db.execute(
                "UPDATE api_keys SET key_hash = ?, rotated_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                (_hash(plaintext), time.time(), key_id),
            )
        if cursor.rowcount != 1:
            raise KeyError(key_id)
        return plaintext

    def revoke(self, key_id: str) -> ApiKeyRecord:
        """Revoke ``key_id`` (idempotent: revoking twice keeps the first time).

        Raises:
            KeyError: no such key.
        """
        with self._connect() as db:
            db.execute(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE key_id = ?",
                (time.time(), key_id),
            )
        record = self.get(key_id)
        if record is None:
            raise KeyError(key_id)
        return record

    @staticmethod
    def matches(record: ApiKeyRecord | None, plaintext: str) -> bool:
        """Whether ``plaintext`` is the key ``record`` stores, in constant time.

        A missing record still costs one comparison, so timing does not reveal which ids exist.
        """
        candidate = _hash(plaintext)
        expected = record.key_hash if record is not None else _DUMMY_HASH
        return hmac.compare_digest(candidate, expected) and record is not None

    def verify(self, plaintext: str) -> ApiKeyRecord | None:
        """The active record for a presented key, or ``None`` if it is unknown, wrong or revoked."""
        key_id = parse_key(plaintext)
        record = self.get(key_id) if key_id else None
        if not self.matches(record, plaintext) or record is None or record.revoked:
            return None
        return record


def bootstrap_first_key(settings: GatewaySettings, name: str = "first-key", tier: str | None = None) -> str:
    """Create an all-models key in the configured store, for the platform's start command.

    Args:
        settings: the gateway settings (``keys_db`` and ``default_tier`` are used).
        name: the key's label.
        tier: the tier; the settings' default tier when ``None``.

    Returns:
        The plaintext key, to print once; only its hash is stored.
    """
    store = KeyStore(settings.keys_db)
    _, plaintext = store.create(name, [ALL_MODELS], tier or settings.default_tier)
    return plaintext
