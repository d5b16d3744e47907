"""The job runner's decisions, with a real (SQLite) job store and a stand-in for the generation call:
a busy model sends the job back to the queue, a cancel made elsewhere stops the run, errors become the
job's error, and a stopping process hands its running job back at once.

The generation through the real gateway and Triton is tests/gateway/test_gateway_jobs.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.app import ERROR_STATUS
from gateway.errors import InferenceInputError, Overloaded
from gateway.http.problems import ProblemRenderer
from gateway.jobs.runner import JobRunner
from gateway.jobs.store import Job, JobStatus, new_job_id
from gateway.jobs.store_sqlite import SqliteJobStore
from gateway.settings import GatewaySettings
from gateway.tasks.openai_inputs import ImageRequest
from gateway.tenancy.usage import UsageMeter


class Generation:
    """Stands in for ``OpenAITasks.run_image_job``: each call runs the next behaviour given."""

    def __init__(self, *behaviours: Callable[[], Any]) -> None:
        self.behaviours = list(behaviours)
        self.calls = 0
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def run_image_job(
        self, ctx: Any, model: str, request: ImageRequest, timeout_s: float
    ) -> list[bytes]:
        self.calls += 1
        self.started.set()
        try:
            return await self.behaviours.pop(0)()  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def _images() -> list[bytes]:
    return [b"png-bytes"]


async def _forever() -> list[bytes]:
    await asyncio.Event().wait()
    return []


def _raise(exc: Exception) -> Callable[[], Any]:
    async def run() -> list[bytes]:
        raise exc

    return run


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteJobStore]:
    made = SqliteJobStore(tmp_path / "jobs.sqlite3", ttl_s=60)
    yield made
    await made.close()


@contextlib.asynccontextmanager
async def _running(store: SqliteJobStore, generation: Generation) -> AsyncIterator[JobRunner]:
    settings = GatewaySettings(job_heartbeat_s=0.05, job_poll_interval_s=0.05, job_lease_s=5)
    runner = JobRunner(
        settings,
        store,
        generation,  # type: ignore[arg-type]
        ProblemRenderer(ERROR_STATUS),
        UsageMeter(),
    )
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _submit(store: SqliteJobStore) -> Job:
    job = Job(
        id=new_job_id(),
        owner="key:a",
        model="stable_diffusion",
        created_at=time.time(),
        tier="free",
        request=ImageRequest(prompt="a fox", width=64, height=64, steps=2).to_json(),
    )
    await store.submit(job, max_active=8, max_kept=32)
    return job


async def _until(store: SqliteJobStore, job_id: str, *statuses: JobStatus) -> Job:
    async with asyncio.timeout(30):
        while True:
            job = await store.get(job_id)
            if job is not None and job.status in statuses:
                return job
            await asyncio.sleep(0.02)


async def test_a_busy_model_sends_the_job_back_to_the_queue(store: SqliteJobStore) -> None:
    generation = Generation(_raise(Overloaded("model busy", retry_after_s=1)), _images)
    job = await _submit(store)
    async with _running(store, generation):
        done = await _until(store, job.id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert done.status is JobStatus.SUCCEEDED and generation.calls == 2
    assert done.attempts == 1, "waiting for a busy model is not an attempt"
    assert await store.images(job.id) == [b"png-bytes"] and done.media_type == "image/png"


async def test_a_cancel_made_elsewhere_stops_the_run(store: SqliteJobStore) -> None:
    generation = Generation(_forever)
    job = await _submit(store)
    async with _running(store, generation):
        await generation.started.wait()
        await store.cancel(job.id)  # as another replica would
        async with asyncio.timeout(10):
            await generation.cancelled.wait()
    after = await store.get(job.id)
    assert after is not None and after.status is JobStatus.CANCELLED and after.images == 0


async def test_errors_become_the_jobs_error(store: SqliteJobStore) -> None:
    generation = Generation(
        _raise(InferenceInputError("prompt is too long for the model", field="prompt")),
        _raise(RuntimeError("a bug")),
    )
    refused, broken = await _submit(store), await _submit(store)
    async with _running(store, generation):
        first = await _until(store, refused.id, JobStatus.FAILED)
        second = await _until(store, broken.id, JobStatus.FAILED)
    assert first.error is not None and (
        first.error.status,
        first.error.code,
        first.error.param,
    ) == (400, "inference_input_error", "prompt")
    assert (
        second.error is not None
        and second.error.code == "internal_error"
        and "a bug" not in second.error.message
    )


async def test_a_stopping_process_hands_its_job_back(store: SqliteJobStore) -> None:
    generation = Generation(_forever)
    job = await _submit(store)
    async with _running(store, generation):
        await generation.started.wait()
    assert generation.cancelled.is_set()
    back = await store.get(job.id)
    assert back is not None and back.status is JobStatus.QUEUED and back.attempts == 0
    assert (await store.claim("next", 5, 3)) is not None, "claimable at once, not after the lease"
