"""Image generation as jobs: the record, its states, and the store every gateway process shares.

::

    queued ──claim──▶ running ──finish──▶ succeeded | failed
      ▲  │              │  │
      │  │   release ◀──┘  │ (the model was busy: back to the queue, not an attempt)
      │  └─────cancel──────┴──────────────▶ cancelled
      └── lease expired (the worker died): claimable again, up to ``max_attempts`` claims

- A worker **claims** a job atomically (one worker per job, across every replica and worker process)
  and holds a **lease** it renews while it runs; a worker that dies stops renewing, its lease
  expires, and the next claim takes the job again. A job claimed ``max_attempts`` times fails.
- **Cancel** ends a queued job at once. A running job is marked cancelled in the store; its worker
  sees that at its next renewal (at once when it runs in the same process), stops waiting for
  Triton, and its result, should one arrive, is dropped: :meth:`JobStore.finish` writes only a job
  still running under the worker that finishes it.
- A finished job (succeeded, failed or cancelled) and its images are kept ``ttl_s``, then expire.
- A job with a **callback** URL enters the callback queue when it finishes; deliveries are claimed
  with a lease the same way, so a callback whose sender died is sent by another process.

Stores: :mod:`gateway.jobs.store_redis` (replicas; Redis when ``GATEWAY_REDIS_URL`` is set) and
:mod:`gateway.jobs.store_sqlite` (the single-process default). Both take wall-clock time, since the
processes sharing a store may run on different hosts. Their failures are
:class:`gateway.errors.StateStoreUnavailable` (503).
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.errors import TooManyJobs

__all__ = [
    "CallbackState",
    "Job",
    "JobError",
    "JobStatus",
    "JobStore",
    "limit_reached",
    "Outcome",
    "looks_like_job_id",
    "lost_error",
    "new_job_id",
]

JOB_ID_PREFIX = "imgjob_"


def new_job_id() -> str:
    """A random, unguessable job id (it appears in URLs; reading a job also needs its owner's key)."""
    return JOB_ID_PREFIX + secrets.token_urlsafe(18)


def looks_like_job_id(value: str) -> bool:
    """Whether ``value`` could be a job id (anything else is refused before touching the store)."""
    rest = value.removeprefix(JOB_ID_PREFIX)
    return rest != value and len(rest) == 24 and all(c.isalnum() or c in "-_" for c in rest)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class CallbackState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


@dataclass(frozen=True)
class JobError:
    """Why a job failed, as the synchronous route would have answered (status, code, message, field)."""

    status: int
    code: str
    message: str
    param: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"status": self.status, "code": self.code, "message": self.message, "param": self.param}
        )


@dataclass(frozen=True)
class Outcome:
    """How a run ended: images and their media type (succeeded) or an error (failed)."""

    status: JobStatus
    images: tuple[bytes, ...] = ()
    media_type: str = ""
    error: JobError | None = None


@dataclass(frozen=True)
class Job:
    """One job as stored.

    Attributes:
        id: the job id.
        owner: the submitting credential's ``client_id``: the only one that may read or cancel it.
        kind, tier, scopes: the rest of the submitting principal (the run's priority and share).
        model: the Triton model (admission passed at submission).
        request: the :class:`gateway.tasks.openai_inputs.ImageRequest` as JSON, plus ``response_format``.
        status: see the module docstring.
        created_at, started_at, finished_at, expires_at: Unix times (``None`` until they happen).
        attempts: claims so far.
        worker: the worker that holds (or last held) it.
        error: why it failed.
        images: how many result images are stored.
        media_type: their media type.
        callback_url: where to announce the end ('' for none).
        callback_state, callback_attempts, callback_error: the delivery so far.
    """

    id: str
    owner: str
    model: str
    request: Mapping[str, Any]
    created_at: float
    kind: str = "api_key"
    tier: str = ""
    scopes: tuple[str, ...] = ()
    status: JobStatus = JobStatus.QUEUED
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    attempts: int = 0
    worker: str = ""
    error: JobError | None = None
    images: int = 0
    media_type: str = ""
    callback_url: str = ""
    callback_state: CallbackState | None = None
    callback_attempts: int = 0
    callback_error: str = ""

    # -- the flat string form both stores keep (a Redis hash, a SQLite row's columns) --------------

    def to_fields(self) -> dict[str, str]:
        """Every attribute as a string ('' for ``None``)."""

        def text(value: float | None) -> str:
            return "" if value is None else repr(value)

        return {
            "id": self.id,
            "owner": self.owner,
            "model": self.model,
            "request": json.dumps(dict(self.request), separators=(",", ":")),
            "created_at": repr(self.created_at),
            "kind": self.kind,
            "tier": self.tier,
            "scopes": json.dumps(list(self.scopes)),
            "status": self.status.value,
            "started_at": text(self.started_at),
            "finished_at": text(self.finished_at),
            "expires_at": text(self.expires_at),
            "attempts": str(self.attempts),
            "worker": self.worker,
            "error": "" if self.error is None else self.error.to_json(),
            "images": str(self.images),
            "media_type": self.media_type,
            "callback_url": self.callback_url,
            "callback_state": "" if self.callback_state is None else self.callback_state.value,
            "callback_attempts": str(self.callback_attempts),
            "callback_error": self.callback_error,
        }

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Job:
        """The job behind :meth:`to_fields`' output (as a store gives it back)."""

        def number(name: str) -> float | None:
            value = fields.get(name, "")
            return float(value) if value else None

        error = fields.get("error", "")
        callback_state = fields.get("callback_state", "")
        return cls(
            id=fields["id"],
            owner=fields["owner"],
            model=fields["model"],
            request=json.loads(fields["request"]),
            created_at=float(fields["created_at"]),
            kind=fields.get("kind", "api_key"),
            tier=fields.get("tier", ""),
            scopes=tuple(json.loads(fields.get("scopes") or "[]")),
            status=JobStatus(fields["status"]),
            started_at=number("started_at"),
            finished_at=number("finished_at"),
            expires_at=number("expires_at"),
            attempts=int(fields.get("attempts") or 0),
            worker=fields.get("worker", ""),
            error=JobError(**json.loads(error)) if error else None,
            images=int(fields.get("images") or 0),
            media_type=fields.get("media_type", ""),
            callback_url=fields.get("callback_url", ""),
            callback_state=CallbackState(callback_state) if callback_state else None,
            callback_attempts=int(fields.get("callback_attempts") or 0),
            callback_error=fields.get("callback_error", ""),
        )


def lost_error(attempts: int) -> JobError:
    """Why a job whose worker stopped ``attempts`` times in a row failed."""
    return JobError(
        503, "worker_lost", f"the job was started {attempts} times and its worker stopped each time"
    )


def limit_reached(what: str, count: int, limit: int) -> TooManyJobs:
    """The error for an owner that holds as many jobs as it may: ``active`` (queued or running) or
    ``kept``."""
    if what == "active":
        return TooManyJobs(
            f"this credential already has {count} generation jobs queued or running (at most "
            f"{limit}); wait for one to finish or cancel one",
            retry_after_s=5,
        )
    return TooManyJobs(
        f"this credential already holds {count} generation jobs (at most {limit}, finished ones "
        "included until they expire); delete finished ones to make room",
        retry_after_s=60,
    )


class JobStore(ABC):
    """Where jobs live, shared by every gateway process that uses the same store.

    Every method is atomic in the store; times are wall-clock Unix seconds. A finished job and its
    images are kept for the store's ``ttl_s``.
    """

    ttl_s: float

    @abstractmethod
    async def submit(self, job: Job, *, max_active: int, max_kept: int) -> None:
        """Store a new queued job.

        Raises:
            TooManyJobs: the owner holds ``max_active`` unfinished or ``max_kept`` jobs.
        """

    @abstractmethod
    async def get(self, job_id: str) -> Job | None:
        """The job, or ``None`` (never was, expired or deleted)."""

    @abstractmethod
    async def list_jobs(self, owner: str | None, limit: int) -> list[Job]:
        """The owner's jobs (everyone's with ``None``), newest first, at most ``limit``."""

    @abstractmethod
    async def claim(self, worker: str, lease_s: float, max_attempts: int) -> Job | None:
        """The oldest job that is queued (or whose worker's lease expired), now running under ``worker``.

        A job claimed ``max_attempts`` times already is failed instead (its worker died each time).
        """

    @abstractmethod
    async def renew(self, job_id: str, worker: str, lease_s: float) -> JobStatus | None:
        """Extend ``worker``'s lease; returns the job's status (``None``: it is not ``worker``'s any more)."""

    @abstractmethod
    async def release(self, job_id: str, worker: str, delay_s: float) -> bool:
        """Put a running job back in the queue, claimable after ``delay_s`` (not counted as an attempt)."""

    @abstractmethod
    async def finish(self, job_id: str, worker: str, outcome: Outcome) -> bool:
        """End a job ``worker`` runs with ``outcome``; ``False`` (nothing written) if it is not running
        under ``worker`` any more (cancelled, or re-claimed after a lost lease)."""

    @abstractmethod
    async def cancel(self, job_id: str) -> Job | None:
        """Cancel a queued or running job; returns the job as it now is (unchanged when it had
        finished already), ``None`` when there is none."""

    @abstractmethod
    async def delete(self, job_id: str) -> bool:
        """Delete a finished job and its images; ``False`` when there is none or it has not finished."""

    @abstractmethod
    async def images(self, job_id: str) -> list[bytes]:
        """The result images of a succeeded job (empty when none or expired)."""

    @abstractmethod
    async def claim_callback(self, worker: str, lease_s: float) -> Job | None:
        """A finished job whose callback is due, leased to ``worker`` for one delivery attempt."""

    @abstractmethod
    async def callback_done(
        self, job_id: str, state: CallbackState, error: str, retry_in_s: float | None
    ) -> None:
        """Record a delivery attempt: ``retry_in_s`` queues the next one; ``None`` ends with ``state``."""

    @abstractmethod
    async def close(self) -> None: ...
