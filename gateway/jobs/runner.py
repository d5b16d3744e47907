"""The workers that run generation jobs and send their callbacks, in every gateway process.

Each process runs ``GATEWAY_JOB_WORKERS`` job loops and one callback loop (its app's lifespan starts
and stops them). A job loop claims a job from the shared store (:mod:`gateway.jobs.store`: atomic, one
worker per job), runs it through :meth:`gateway.tasks.openai.OpenAITasks.run_image_job` with the
job's deadline (which travels to Triton as each request's timeout), and renews its lease every
``GATEWAY_JOB_HEARTBEAT_S``. A renewal that finds the job cancelled (from any replica) cancels the
run: the gateway stops waiting for Triton, Triton drops what is still queued when the deadline it was
given passes, and the result, should one come, is not written. A cancel arriving at the process that
runs the job takes effect at once.

What a run can meet:

- the tier's in-flight share is taken, Triton's queue is full, Triton or the model is unavailable:
  the job goes back to the queue (not counted as an attempt), to be tried again a little later, until
  ``GATEWAY_JOB_TIMEOUT_S`` after its submission; then it fails with that error;
- any other error of the gateway's tree: the job fails with it (status, code, message and field as
  the synchronous route would have answered);
- anything else: the job fails with an internal error, logged with its traceback;
- the process stops: running jobs are put back in the queue for another worker at once (a process
  that is killed instead loses its lease after ``GATEWAY_JOB_LEASE_S``).

Runs are metered for usage like synchronous requests (per owner, model and day). Callbacks are sent
by :class:`gateway.jobs.callback_sender.CallbackSender`, claimed from the store's callback queue
with a lease, so a delivery whose process died is retried by another.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import GatewayError, Overloaded, ServiceUnavailable, StateStoreUnavailable
from gateway.http.problems import ProblemRenderer
from gateway.jobs.callback_sender import CallbackSender
from gateway.jobs.service import job_document
from gateway.jobs.store import CallbackState, Job, JobError, JobStatus, JobStore, Outcome
from gateway.settings import GatewaySettings
from gateway.tasks.openai import OpenAITasks
from gateway.tasks.openai_inputs import IMAGE_FORMATS, ImageRequest
from gateway.tenancy.context import Principal, RequestContext
from gateway.tenancy.usage import UsageMeter

__all__ = ["JobRunner", "worker_name"]

log = logging.getLogger(__name__)

#: callbacks one process sends at once
CALLBACK_CONCURRENCY = 4
#: the longest a job waits before another try after its model was busy or unavailable
MAX_RETRY_DELAY_S = 30.0


def worker_name() -> str:
    """This process's name in the store: host, pid and a random part (a restarted pid is a new worker)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class JobRunner:
    """Runs jobs and sends callbacks for one gateway process.

    Args:
        settings: workers, deadlines, leases, callback retries.
        store: the job store.
        tasks: runs the generation.
        renderer: the app's status table (a failed job records the status the route would have sent).
        meter: usage metering.
        sender: sends callbacks; ``None`` when callbacks are off.
        clock: wall-clock seconds.
    """

    settings: GatewaySettings
    store: JobStore
    tasks: OpenAITasks
    renderer: ProblemRenderer
    meter: UsageMeter
    sender: CallbackSender | None = None
    clock: Callable[[], float] = time.time
    worker: str = field(default_factory=worker_name, init=False)

    def __post_init__(self) -> None:
        self._wake_jobs = asyncio.Event()
        self._wake_callbacks = asyncio.Event()
        self._running: dict[str, asyncio.Task[list[bytes]]] = {}
        self._store_down = False

    def wake(self) -> None:
        """A job was submitted here: look now rather than at the next poll."""
        self._wake_jobs.set()

    def cancel_local(self, job_id: str) -> None:
        """Stop waiting for a job this process runs (cancelled in the store already)."""
        run = self._running.get(job_id)
        if run is not None:
            run.cancel()

    async def run(self) -> None:
        """The job loops and the callback loop, until cancelled (the lifespan does)."""
        async with asyncio.TaskGroup() as group:
            for _ in range(self.settings.job_workers):
                group.create_task(self._job_loop())
            if self.sender is not None:
                group.create_task(self._callback_loop())

    async def _idle(self, event: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), self.settings.job_poll_interval_s)
        event.clear()

    def _store_failed(self, exc: StateStoreUnavailable) -> None:
        if not self._store_down:  # once per outage
            log.warning("jobs: the job store cannot be reached (%s); retrying", exc.detail)
        self._store_down = True

    # -- jobs -----------------------------------------------------------------------------------

    async def _job_loop(self) -> None:
        settings = self.settings
        while True:
            try:
                job = await self.store.claim(
                    self.worker, settings.job_lease_s, settings.job_max_attempts
                )
            except StateStoreUnavailable as exc:
                self._store_failed(exc)
                await self._idle(self._wake_jobs)
                continue
            self._store_down = False
            if job is None:
                await self._idle(self._wake_jobs)
                continue
            await self._execute(job)

    async def _execute(self, job: Job) -> None:
        settings = self.settings
        ctx = RequestContext(
            request_id=job.id[-16:],
            principal=Principal(job.owner, frozenset(job.scopes), job.tier, job.kind),
        )
        request = ImageRequest.from_json(job.request)
        remaining = settings.job_timeout_s - max(0.0, self.clock() - job.created_at)
        run = asyncio.create_task(
            self.tasks.run_image_job(ctx, job.model, request, max(1.0, remaining))
        )
        self._running[job.id] = run
        log.info("job %s: running (attempt %d, owner %s)", job.id, job.attempts, job.owner)
        try:
            await self._watch(job, run)
        except (
            asyncio.CancelledError
        ):  # this process is stopping: let another worker take the job now
            run.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(job.id, self.worker, 0))
            raise
        finally:
            self._running.pop(job.id, None)
        outcome = await self._outcome(job, run, request)
        if ctx.admitted and ctx.model is not None and outcome is not None:
            status = outcome.error.status if outcome.error is not None else 200
            self.meter.record(job.owner, ctx.model, status, ctx.usage, ctx.stages.get("upstream"))
        if outcome is None:
            return
        try:
            written = await self.store.finish(job.id, self.worker, outcome)
        except StateStoreUnavailable as exc:
            self._store_failed(exc)  # the lease runs out and the job is run again
            return
        if not written:
            log.info("job %s: result dropped (cancelled or taken over meanwhile)", job.id)
        elif job.callback_url:
            self._wake_callbacks.set()
        log.info("job %s: %s", job.id, outcome.status.value)

    async def _watch(self, job: Job, run: asyncio.Task[list[bytes]]) -> None:
        """Wait for ``run``, renewing the lease; cancel it when the job is no longer ours to run."""
        while True:
            done, _ = await asyncio.wait({run}, timeout=self.settings.job_heartbeat_s)
            if done:
                return
            try:
                status = await self.store.renew(job.id, self.worker, self.settings.job_lease_s)
            except StateStoreUnavailable as exc:
                self._store_failed(exc)  # keep running: the store may be back before the lease ends
                continue
            if status is not JobStatus.RUNNING:
                log.info(
                    "job %s: %s elsewhere; stopping",
                    job.id,
                    status.value if status else "taken over",
                )
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                return

    async def _outcome(
        self, job: Job, run: asyncio.Task[list[bytes]], request: ImageRequest
    ) -> Outcome | None:
        """How the run ended, or ``None`` when nothing is to be written (cancelled, or put back)."""
        if run.cancelled():
            return None
        exc = run.exception()
        if exc is None:
            media_type = IMAGE_FORMATS[request.output_format][1]
            return Outcome(JobStatus.SUCCEEDED, tuple(run.result()), media_type)
        remaining_s = self.settings.job_timeout_s - (self.clock() - job.created_at)
        if isinstance(exc, Overloaded | ServiceUnavailable) and remaining_s > 1:
            delay = min(MAX_RETRY_DELAY_S, max(1.0, exc.retry_after_s), remaining_s)
            log.info("job %s: %s; back to the queue for %.0f s", job.id, exc.detail, delay)
            try:
                await self.store.release(job.id, self.worker, delay)
            except StateStoreUnavailable as failed:
                self._store_failed(failed)  # its lease runs out instead
            return None
        if isinstance(exc, GatewayError):
            report = self.renderer.report(exc)
            return Outcome(
                JobStatus.FAILED,
                error=JobError(report.status, report.name, report.detail, report.field),
            )
        log.error("job %s: failed", job.id, exc_info=exc)
        return Outcome(
            JobStatus.FAILED,
            error=JobError(500, "internal_error", "the gateway failed; see its log"),
        )

    # -- callbacks -----------------------------------------------------------------------------

    async def _callback_loop(self) -> None:
        lease = self.settings.callback_timeout_s * 2 + 5
        limit = asyncio.Semaphore(CALLBACK_CONCURRENCY)
        async with asyncio.TaskGroup() as group:
            while True:
                await limit.acquire()
                try:
                    job = await self.store.claim_callback(self.worker, lease)
                except StateStoreUnavailable as exc:
                    self._store_failed(exc)
                    job = None
                if job is None:
                    limit.release()
                    await self._idle(self._wake_callbacks)
                    continue
                group.create_task(self._deliver(job, limit))

    async def _deliver(self, job: Job, limit: asyncio.Semaphore) -> None:
        assert self.sender is not None
        settings = self.settings
        try:
            document = job_document(job, settings.image_generation_model)
            event = {
                "type": f"{document['object']}.{job.status.value}",
                "created": int(self.clock()),
                "data": document,
            }
            result = await self.sender.send(job.callback_url, self.sender.body(event), job.id)
            if result.delivered:
                state, retry_in = CallbackState.DELIVERED, None
            elif result.retry and job.callback_attempts < settings.callback_max_attempts:
                state = CallbackState.PENDING
                retry_in = self.sender.backoff_s(job.callback_attempts, settings.callback_backoff_s)
            else:
                state, retry_in = CallbackState.FAILED, None
            log.info(
                "job %s: callback attempt %d: %s%s",
                job.id,
                job.callback_attempts,
                "delivered" if result.delivered else "failed",
                f" ({result.error})" if result.error else "",
            )
            await self.store.callback_done(job.id, state, result.error, retry_in)
        except StateStoreUnavailable as exc:
            self._store_failed(exc)  # the lease runs out and the delivery is tried again
        finally:
            limit.release()
