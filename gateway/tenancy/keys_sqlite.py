"""API keys in a SQLite file: the single-process default of the gateway (``inferctl up``).

Safe for several processes on one host (WAL mode, short transactions; each call opens its own
connection, so no connection is shared across threads or event loops). Replicas and workers share
keys through Redis instead (:mod:`gateway.tenancy.redis_state`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gateway.tenancy.keys import (
    ApiKeyRecord,
    ImportResult,
    KeyStore,
    check_import,
    hash_key,
    new_key,
    plan_import,
)
from gateway.tenancy.private_files import create_private

__all__ = ["SqliteKeyStore"]

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


class SqliteKeyStore(KeyStore):
    """SQLite-backed API keys.

    Args:
        path: the database file; created (with its parent directory) if missing.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        create_private(self.path)  # key hashes / tenants' data: mode 0600
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

    def _add_new(self, record: ApiKeyRecord) -> bool:
        try:
            with self._connect() as db:
                db.execute(
                    "INSERT INTO api_keys (key_id, name, key_hash, scopes, tier, created_at) "
                    "VALUES (?,?,?,?,?,?)",
                    (
                        record.key_id,
                        record.name,
                        record.key_hash,
                        json.dumps(list(record.scopes)),
                        record.tier,
                        record.created_at,
                    ),
                )
        except sqlite3.IntegrityError:
            return False
        return True

    def get(self, key_id: str) -> ApiKeyRecord | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return self._record(row) if row else None

    def list(self, include_revoked: bool = True) -> list[ApiKeyRecord]:
        query = "SELECT * FROM api_keys" + ("" if include_revoked else " WHERE revoked_at IS NULL")
        with self._connect() as db:
            return [self._record(r) for r in db.execute(query + " ORDER BY created_at, key_id")]

    def rotate(self, key_id: str) -> str:
        _, plaintext = new_key(key_id)
        with self._connect() as db:
            cursor = db.execute(
                "UPDATE api_keys SET key_hash = ?, rotated_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                (hash_key(plaintext), time.time(), key_id),
            )
        if cursor.rowcount != 1:
            raise KeyError(key_id)
        return plaintext

    def _mark_revoked(self, key_id: str) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE key_id = ?",
                (time.time(), key_id),
            )

    def import_records(self, records: Sequence[ApiKeyRecord]) -> ImportResult:
        check_import(records)
        with self._connect() as db:
            # One write transaction: the check and the inserts see the same table.
            db.execute("BEGIN IMMEDIATE")
            try:
                existing = {r.key_id: self._fetch(db, r.key_id) for r in records}
                write, skipped = plan_import(records, existing)
                db.executemany(
                    "INSERT INTO api_keys (key_id, name, key_hash, scopes, tier, created_at, rotated_at, "
                    "revoked_at) VALUES (?,?,?,?,?,?,?,?)",
                    [
                        (
                            r.key_id,
                            r.name,
                            r.key_hash,
                            json.dumps(list(r.scopes)),
                            r.tier,
                            r.created_at,
                            r.rotated_at,
                            r.revoked_at,
                        )
                        for r in write
                    ],
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return ImportResult([r.key_id for r in write], skipped)

    def _fetch(self, db: sqlite3.Connection, key_id: str) -> ApiKeyRecord | None:
        row = db.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return self._record(row) if row else None
