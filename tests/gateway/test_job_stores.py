"""The job stores, SQLite and Redis (a real redis-server), held to one contract: atomic claims,
leases that outlive a dead worker, cancels that drop late results, limits per owner, expiry, and the
callback queue."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.errors import TooManyJobs
from gateway.jobs.store import (
    CallbackState,
    Job,
    JobError,
    JobStatus,
    JobStore,
    Outcome,
    new_job_id,
)
from gateway.jobs.store_redis import RedisJobStore
from gateway.jobs.store_sqlite import SqliteJobStore
from tests.support.fake_clock import FakeClock

TTL_S = 100.0


@pytest.fixture(params=["sqlite", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[JobStore, FakeClock]]:
    clock = FakeClock(time.time())
    if request.param == "sqlite":
        made: JobStore = SqliteJobStore(tmp_path / "jobs.sqlite3", TTL_S, clock=clock)
    else:
        url = request.getfixturevalue("redis_url")
        made = RedisJobStore(url, TTL_S, prefix=f"t{uuid.uuid4().hex[:8]}:", clock=clock)
    yield made, clock
    await made.close()


def _job(owner: str = "key:a", callback_url: str = "", at: float = 0.0) -> Job:
    return Job(
        id=new_job_id(),
        owner=owner,
        model="stable_diffusion",
        request={"prompt": "a fox", "n": 2},
        created_at=at or time.time(),
        tier="free",
        scopes=("*",),
        callback_url=callback_url,
    )


async def test_a_job_runs_once_and_keeps_its_images(store: tuple[JobStore, FakeClock]) -> None:
    jobs, clock = store
    job = _job(at=clock.now)
    await jobs.submit(job, max_active=8, max_kept=32)
    assert (await jobs.get(job.id)) == job
    claimed = await asyncio.gather(*(jobs.claim(f"w{i}", 10, 3) for i in range(4)))
    winners = [c for c in claimed if c is not None]
    assert len(winners) == 1, "a job is claimed by one worker"
    running = winners[0]
    assert (
        running.status is JobStatus.RUNNING
        and running.attempts == 1
        and running.started_at == clock.now
    )
    assert await jobs.renew(job.id, running.worker, 10) is JobStatus.RUNNING
    assert await jobs.renew(job.id, "someone-else", 10) is None
    images = (b"\x89PNG one", b"\x89PNG two\x00\xff")
    assert await jobs.finish(
        job.id, running.worker, Outcome(JobStatus.SUCCEEDED, images, "image/png")
    )
    done = await jobs.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED and done.images == 2
    assert done.media_type == "image/png" and done.expires_at == pytest.approx(clock.now + TTL_S)
    assert done.callback_state is None and await jobs.claim_callback("w", 5) is None
    assert await jobs.images(job.id) == list(images)
    assert await jobs.finish(job.id, running.worker, Outcome(JobStatus.FAILED)) is False, (
        "finished once"
    )
    clock.now += TTL_S + 1
    assert await jobs.get(job.id) is None and await jobs.images(job.id) == []


async def test_limits_per_owner(store: tuple[JobStore, FakeClock]) -> None:
    jobs, clock = store
    first, second = _job(at=clock.now - 1), _job(at=clock.now)
    await jobs.submit(first, max_active=2, max_kept=3)
    await jobs.submit(second, max_active=2, max_kept=3)
    with pytest.raises(TooManyJobs) as active:
        await jobs.submit(_job(at=clock.now), max_active=2, max_kept=3)
    assert "2 generation jobs queued or running" in active.value.detail
    await jobs.submit(
        _job(owner="key:b", at=clock.now), max_active=2, max_kept=3
    )  # another owner's count
    assert (await jobs.cancel(first.id)) is not None
    await jobs.submit(_job(at=clock.now), max_active=2, max_kept=3)
    with pytest.raises(TooManyJobs) as kept:
        await jobs.cancel(second.id)
        await jobs.submit(_job(at=clock.now), max_active=2, max_kept=3)
    assert "holds 3 generation jobs (at most 3" in kept.value.detail
    assert await jobs.delete(first.id) and await jobs.get(first.id) is None
    await jobs.submit(_job(at=clock.now), max_active=2, max_kept=3)
    clock.now += TTL_S + 1  # the cancelled second job expires: room again
    await jobs.submit(_job(at=clock.now), max_active=3, max_kept=3)
    mine = await jobs.list_jobs("key:a", 10)
    assert len(mine) == 3 and all(j.owner == "key:a" for j in mine)
    assert [j.created_at for j in mine] == sorted((j.created_at for j in mine), reverse=True)
    assert {j.owner for j in await jobs.list_jobs(None, 10)} == {"key:a", "key:b"}


async def test_cancel_drops_a_late_result(store: tuple[JobStore, FakeClock]) -> None:
    jobs, clock = store
    queued, running = _job(at=clock.now - 1), _job(at=clock.now)
    for job in (queued, running):
        await jobs.submit(job, max_active=8, max_kept=32)
    cancelled = await jobs.cancel(queued.id)
    assert (
        cancelled is not None
        and cancelled.status is JobStatus.CANCELLED
        and cancelled.finished_at == clock.now
    )
    claimed = await jobs.claim("w", 10, 3)
    assert claimed is not None and claimed.id == running.id, "a cancelled job is never claimed"
    assert (await jobs.cancel(running.id)).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    assert await jobs.renew(running.id, "w", 10) is JobStatus.CANCELLED, (
        "the worker learns it at its renewal"
    )
    assert not await jobs.finish(
        running.id, "w", Outcome(JobStatus.SUCCEEDED, (b"late",), "image/png")
    )
    assert (
        await jobs.images(running.id) == []
        and (await jobs.get(running.id)).status is JobStatus.CANCELLED
    )  # type: ignore[union-attr]
    again = await jobs.cancel(running.id)
    assert again is not None and again.status is JobStatus.CANCELLED, (
        "cancelling twice changes nothing"
    )
    assert await jobs.cancel(new_job_id()) is None
    assert not await jobs.delete(new_job_id())


async def test_a_dead_workers_job_is_taken_over_then_given_up(
    store: tuple[JobStore, FakeClock],
) -> None:
    jobs, clock = store
    job = _job(at=clock.now)
    await jobs.submit(job, max_active=8, max_kept=32)
    first = await jobs.claim("dead", 10, 2)
    assert first is not None and await jobs.claim("other", 10, 2) is None, "leased"
    clock.now += 11  # "dead" never renewed
    second = await jobs.claim("other", 10, 2)
    assert (
        second is not None
        and second.id == job.id
        and second.attempts == 2
        and second.worker == "other"
    )
    assert await jobs.renew(job.id, "dead", 10) is None
    assert not await jobs.finish(job.id, "dead", Outcome(JobStatus.SUCCEEDED, (b"x",), "image/png"))
    clock.now += 11  # and "other" died too
    assert await jobs.claim("third", 10, 2) is None
    failed = await jobs.get(job.id)
    assert failed is not None and failed.status is JobStatus.FAILED and failed.error is not None
    assert failed.error.code == "worker_lost" and "2 times" in failed.error.message


async def test_release_puts_a_job_back_without_counting_an_attempt(
    store: tuple[JobStore, FakeClock],
) -> None:
    jobs, clock = store
    job = _job(at=clock.now)
    await jobs.submit(job, max_active=8, max_kept=32)
    assert await jobs.claim("w", 10, 1) is not None
    assert await jobs.release(job.id, "w", 5)
    assert (await jobs.get(job.id)).status is JobStatus.QUEUED  # type: ignore[union-attr]
    assert await jobs.claim("w", 10, 1) is None, "not before its delay"
    clock.now += 6
    again = await jobs.claim("w", 10, 1)
    assert again is not None and again.attempts == 1
    error = JobError(400, "inference_input_error", "bad", "prompt")
    assert await jobs.finish(job.id, "w", Outcome(JobStatus.FAILED, error=error))
    assert (await jobs.get(job.id)).error == error  # type: ignore[union-attr]


async def test_callbacks_are_leased_retried_and_recorded(store: tuple[JobStore, FakeClock]) -> None:
    jobs, clock = store
    job = _job(callback_url="https://hooks.example.com/done", at=clock.now)
    await jobs.submit(job, max_active=8, max_kept=32)
    assert await jobs.claim_callback("w", 5) is None, "nothing to announce before the job ends"
    await jobs.cancel(job.id)
    leased = await jobs.claim_callback("w", 5)
    assert leased is not None and leased.id == job.id and leased.callback_attempts == 1
    assert leased.callback_state is CallbackState.PENDING and leased.status is JobStatus.CANCELLED
    assert await jobs.claim_callback("v", 5) is None, "one sender at a time"
    await jobs.callback_done(job.id, CallbackState.PENDING, "HTTP 503", retry_in_s=2)
    assert await jobs.claim_callback("v", 5) is None
    clock.now += 3
    retried = await jobs.claim_callback("v", 5)
    assert (
        retried is not None
        and retried.callback_attempts == 2
        and retried.callback_error == "HTTP 503"
    )
    await jobs.callback_done(job.id, CallbackState.DELIVERED, "", retry_in_s=None)
    clock.now += 10
    assert await jobs.claim_callback("v", 5) is None
    assert (await jobs.get(job.id)).callback_state is CallbackState.DELIVERED  # type: ignore[union-attr]


async def test_jobs_outlive_the_store_object(
    store: tuple[JobStore, FakeClock], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    jobs, clock = store
    job = _job(at=clock.now)
    await jobs.submit(job, max_active=8, max_kept=32)
    if isinstance(jobs, SqliteJobStore):
        reopened: JobStore = SqliteJobStore(jobs.path, TTL_S, clock=clock)
    else:
        reopened = RedisJobStore(
            request.getfixturevalue("redis_url"), TTL_S, prefix=jobs._p, clock=clock
        )
    try:
        claimed = await reopened.claim("new-process", 10, 3)
        assert claimed is not None and claimed.id == job.id and claimed.request == job.request
    finally:
        await reopened.close()
