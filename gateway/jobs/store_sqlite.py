"""Generation jobs in a SQLite file: the single-process default (no Redis), surviving a restart.

One table of jobs (the record as JSON, plus the columns the queries select on) and one of result
images. Every change is one ``BEGIN IMMEDIATE`` transaction (the write lock is taken before the
read), so a claim is atomic even when another process opens the same file. Finished jobs past their
expiry are deleted by the next submission or claim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from gateway.errors import StateStoreUnavailable
from gateway.jobs.store import (
    CallbackState,
    Job,
    JobStatus,
    JobStore,
    Outcome,
    limit_reached,
    lost_error,
)
from gateway.tenancy.private_files import create_private

__all__ = ["SqliteJobStore"]

T = TypeVar("T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS jobs (
        id           TEXT PRIMARY KEY,
        owner        TEXT NOT NULL,
        status       TEXT NOT NULL,
        created_at   REAL NOT NULL,
        due          REAL,      -- queued: claimable from; running: the lease's end; NULL once finished
        expires_at   REAL,      -- finished: deleted from; NULL before
        callback_due REAL,      -- a pending callback: its next attempt (or its lease's end)
        record       TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner, created_at)",
    "CREATE INDEX IF NOT EXISTS jobs_due ON jobs (due) WHERE due IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS jobs_callback ON jobs (callback_due) WHERE callback_due IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS job_images (
        job_id TEXT NOT NULL, position INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (job_id, position)
    )""",
)


class SqliteJobStore(JobStore):
    """Jobs in a SQLite file on local disk (see the module docstring).

    Args:
        path: the database file (created with its folder).
        ttl_s: how long a finished job and its images are kept.
        clock: wall-clock seconds (tests pass their own).
    """

    def __init__(
        self, path: Path | str, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.ttl_s = ttl_s
        create_private(self.path)  # key hashes / tenants' data: mode 0600
        self._clock = clock
        db = self._connect()
        try:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                db.execute(statement)
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=5.0, isolation_level=None)

    async def _run(self, body: Callable[[sqlite3.Connection, float], T]) -> T:
        def transaction() -> T:
            db = self._connect()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    value = body(db, self._clock())
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return value
            finally:
                db.close()

        try:
            return await asyncio.to_thread(transaction)
        except sqlite3.Error as exc:
            raise StateStoreUnavailable(
                f"the job store failed ({type(exc).__name__})", retry_after_s=1
            ) from exc

    # -- rows -----------------------------------------------------------------------------------

    @staticmethod
    def _load(db: sqlite3.Connection, job_id: str) -> Job | None:
        row = db.execute("SELECT record FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return Job.from_fields(json.loads(row[0])) if row else None

    @staticmethod
    def _save(
        db: sqlite3.Connection, job: Job, *, due: float | None, callback_due: float | None
    ) -> None:
        db.execute(
            "INSERT OR REPLACE INTO jobs (id, owner, status, created_at, due, expires_at, "
            "callback_due, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job.id,
                job.owner,
                job.status.value,
                job.created_at,
                due,
                job.expires_at,
                callback_due,
                json.dumps(job.to_fields()),
            ),
        )

    def _first_due(
        self, db: sqlite3.Connection, column: Literal["due", "callback_due"], now: float
    ) -> Job | None:
        """The job due first by ``column`` (its work or its callback), or ``None`` when none is due
        at ``now``."""
        row = db.execute(
            f"SELECT id FROM jobs WHERE {column} IS NOT NULL AND {column} <= ? ORDER BY {column} LIMIT 1",
            (now,),
        ).fetchone()
        if row is None:
            return None
        job = self._load(db, row[0])
        assert job is not None
        return job

    @staticmethod
    def _callback_due(db: sqlite3.Connection, job_id: str) -> float | None:
        row = db.execute("SELECT callback_due FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    @staticmethod
    def _purge(db: sqlite3.Connection, now: float) -> None:
        db.execute(
            "DELETE FROM job_images WHERE job_id IN (SELECT id FROM jobs WHERE expires_at <= ?)",
            (now,),
        )
        db.execute("DELETE FROM jobs WHERE expires_at <= ?", (now,))

    def _end(self, db: sqlite3.Connection, job: Job, now: float) -> Job:
        """Write ``job`` as finished: expiring, its callback (if any) due now."""
        pending = bool(job.callback_url)
        ended = dataclasses.replace(
            job,
            finished_at=now,
            expires_at=now + self.ttl_s,
            callback_state=CallbackState.PENDING if pending else None,
        )
        self._save(db, ended, due=None, callback_due=now if pending else None)
        return ended

    # -- the interface --------------------------------------------------------------------------

    async def submit(self, job: Job, *, max_active: int, max_kept: int) -> None:
        def body(db: sqlite3.Connection, now: float) -> None:
            self._purge(db, now)
            active, kept = db.execute(
                "SELECT COUNT(*) FILTER (WHERE expires_at IS NULL), COUNT(*) FROM jobs WHERE owner = ?",
                (job.owner,),
            ).fetchone()
            if active >= max_active:
                raise limit_reached("active", active, max_active)
            if kept >= max_kept:
                raise limit_reached("kept", kept, max_kept)
            self._save(db, job, due=job.created_at, callback_due=None)

        await self._run(body)

    async def get(self, job_id: str) -> Job | None:
        return await self._run(lambda db, now: self._visible(self._load(db, job_id), now))

    @staticmethod
    def _visible(job: Job | None, now: float) -> Job | None:
        return (
            None if job is None or (job.expires_at is not None and job.expires_at <= now) else job
        )

    async def list_jobs(self, owner: str | None, limit: int) -> list[Job]:
        def body(db: sqlite3.Connection, now: float) -> list[Job]:
            where, args = ("WHERE owner = ?", [owner]) if owner is not None else ("", [])
            rows = db.execute(
                f"SELECT record FROM jobs {where} ORDER BY created_at DESC LIMIT ?", [*args, limit]
            ).fetchall()
            jobs = [Job.from_fields(json.loads(r[0])) for r in rows]
            return [j for j in jobs if self._visible(j, now) is not None]

        return await self._run(body)

    async def claim(self, worker: str, lease_s: float, max_attempts: int) -> Job | None:
        def body(db: sqlite3.Connection, now: float) -> Job | None:
            self._purge(db, now)
            while True:
                job = self._first_due(db, "due", now)
                if job is None:
                    return None
                if job.attempts >= max_attempts:
                    self._end(
                        db,
                        dataclasses.replace(
                            job, status=JobStatus.FAILED, error=lost_error(job.attempts)
                        ),
                        now,
                    )
                    continue
                claimed = dataclasses.replace(
                    job,
                    status=JobStatus.RUNNING,
                    worker=worker,
                    attempts=job.attempts + 1,
                    started_at=job.started_at or now,
                )
                self._save(db, claimed, due=now + lease_s, callback_due=None)
                return claimed

        return await self._run(body)

    async def renew(self, job_id: str, worker: str, lease_s: float) -> JobStatus | None:
        def body(db: sqlite3.Connection, now: float) -> JobStatus | None:
            job = self._load(db, job_id)
            if job is None or job.worker != worker:
                return None
            if job.status is JobStatus.RUNNING:
                db.execute("UPDATE jobs SET due = ? WHERE id = ?", (now + lease_s, job_id))
            return job.status

        return await self._run(body)

    async def release(self, job_id: str, worker: str, delay_s: float) -> bool:
        def body(db: sqlite3.Connection, now: float) -> bool:
            job = self._load(db, job_id)
            if job is None or job.status is not JobStatus.RUNNING or job.worker != worker:
                return False
            queued = dataclasses.replace(
                job, status=JobStatus.QUEUED, attempts=max(0, job.attempts - 1)
            )
            self._save(db, queued, due=now + delay_s, callback_due=None)
            return True

        return await self._run(body)

    async def finish(self, job_id: str, worker: str, outcome: Outcome) -> bool:
        def body(db: sqlite3.Connection, now: float) -> bool:
            job = self._load(db, job_id)
            if job is None or job.status is not JobStatus.RUNNING or job.worker != worker:
                return False  # cancelled or taken over meanwhile: the result is dropped
            db.executemany(
                "INSERT INTO job_images (job_id, position, data) VALUES (?, ?, ?)",
                [(job_id, k, image) for k, image in enumerate(outcome.images)],
            )
            self._end(
                db,
                dataclasses.replace(
                    job,
                    status=outcome.status,
                    error=outcome.error,
                    images=len(outcome.images),
                    media_type=outcome.media_type,
                ),
                now,
            )
            return True

        return await self._run(body)

    async def cancel(self, job_id: str) -> Job | None:
        def body(db: sqlite3.Connection, now: float) -> Job | None:
            job = self._visible(self._load(db, job_id), now)
            if job is None or job.status.finished:
                return job
            return self._end(db, dataclasses.replace(job, status=JobStatus.CANCELLED), now)

        return await self._run(body)

    async def delete(self, job_id: str) -> bool:
        def body(db: sqlite3.Connection, now: float) -> bool:
            job = self._visible(self._load(db, job_id), now)
            if job is None or not job.status.finished:
                return False
            db.execute("DELETE FROM job_images WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            return True

        return await self._run(body)

    async def images(self, job_id: str) -> list[bytes]:
        def body(db: sqlite3.Connection, now: float) -> list[bytes]:
            if self._visible(self._load(db, job_id), now) is None:
                return []
            rows = db.execute(
                "SELECT data FROM job_images WHERE job_id = ? ORDER BY position", (job_id,)
            )
            return [bytes(r[0]) for r in rows.fetchall()]

        return await self._run(body)

    async def claim_callback(self, worker: str, lease_s: float) -> Job | None:
        def body(db: sqlite3.Connection, now: float) -> Job | None:
            job = self._first_due(db, "callback_due", now)
            if job is None:
                return None
            leased = dataclasses.replace(job, callback_attempts=job.callback_attempts + 1)
            self._save(db, leased, due=None, callback_due=now + lease_s)
            return leased

        return await self._run(body)

    async def callback_done(
        self, job_id: str, state: CallbackState, error: str, retry_in_s: float | None
    ) -> None:
        def body(db: sqlite3.Connection, now: float) -> None:
            job = self._load(db, job_id)
            if job is None:
                return
            done = dataclasses.replace(job, callback_state=state, callback_error=error)
            self._save(
                db, done, due=None, callback_due=None if retry_in_s is None else now + retry_in_s
            )

        await self._run(body)

    async def close(self) -> None:
        return None
