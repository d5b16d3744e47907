"""Image generation jobs as the API offers them: submit, read, list, cancel, delete, fetch the result.

Protocol-neutral like :mod:`gateway.tasks.service` (no FastAPI, no REST models); the routes in
:mod:`gateway.routes.jobs` translate HTTP. The work itself is done by :mod:`gateway.jobs.runner`.

Rules:

- **Submission** checks the request exactly as ``/v1/images/generations`` does (limits, scope, the
  model serves image generation), then the callback URL (:mod:`gateway.jobs.callback_policy`), then the
  caller's rate limits (a submission takes the same rate-limit token a synchronous request takes),
  then, atomically in the store, the key's job limits (:class:`serving.limits.JobLimits`: queued or
  running at once, held at once). The in-flight share is taken only when a worker runs the job.
- **Owner only.** A job is read, cancelled, deleted and its images fetched only with the credential
  that submitted it (its ``client_id``); anyone else gets the 404 a job that does not exist gets. The
  admin credential may read and list every job, but not fetch images, cancel or delete.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.errors import JobNotFinished, NotFound
from gateway.jobs.callback_policy import CallbackPolicy
from gateway.jobs.store import Job, JobStatus, JobStore, looks_like_job_id, new_job_id
from gateway.tasks.openai import OpenAITasks
from gateway.tasks.openai_inputs import ImageRequest
from gateway.tenancy.context import Principal, RequestContext
from serving.limits import DEFAULT_LIMITS, JobLimits

__all__ = ["ImageJobs", "JobResult", "job_document"]

#: what a job document names itself (the ``object`` field)
JOB_OBJECT = "image.generation.job"
#: jobs one listing returns at most
MAX_LISTED = 100


def job_document(job: Job, default_model: str) -> dict[str, Any]:
    """The job as clients see it (the routes' response and the callback's ``data``); never its images."""
    request = dict(job.request)
    callback = None
    if job.callback_url:
        callback = {
            "url": job.callback_url,
            "state": job.callback_state.value if job.callback_state else "waiting",
            "attempts": job.callback_attempts,
            "last_error": job.callback_error or None,
        }
    error = None
    if job.error is not None:
        error = {"code": job.error.code, "message": job.error.message, "param": job.error.param}
    return {
        "id": job.id,
        "object": JOB_OBJECT,
        "status": job.status.value,
        "model": request.get("model") or default_model,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "expires_at": job.expires_at,
        "attempts": job.attempts,
        "request": request,
        "images": job.images,
        "error": error,
        "callback": callback,
    }


@dataclass(frozen=True)
class JobResult:
    """A succeeded job's images, with the format its submission asked for."""

    job: Job
    images: list[bytes]
    response_format: str


def _is_admin(principal: Principal | None) -> bool:
    return principal is not None and principal.kind == "admin"


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class ImageJobs:
    """The job API's operations.

    Args:
        tasks: the OpenAI tasks (request checks, model cards, admission).
        store: where jobs live.
        policy: where callbacks may go.
        wake: tells this process's workers a job was submitted (they also poll).
        limits: the per-key job limits.
        clock: wall-clock seconds.
    """

    tasks: OpenAITasks
    store: JobStore
    policy: CallbackPolicy
    wake: Callable[[], None] = lambda: None
    limits: JobLimits = DEFAULT_LIMITS.jobs
    clock: Callable[[], float] = time.time

    @property
    def default_model(self) -> str:
        return self.tasks.service.settings.image_generation_model

    def document(self, job: Job) -> dict[str, Any]:
        return job_document(job, self.default_model)

    async def submit(
        self,
        ctx: RequestContext,
        request: ImageRequest,
        response_format: str,
        callback_url: str | None,
    ) -> Job:
        """Queue a generation job for the caller.

        Args:
            ctx: the request's context.
            request: what to generate.
            response_format: ``b64_json`` or ``url``, for the result.
            callback_url: where to announce the end, if anywhere.

        Raises:
            BadRequest: a parameter out of range. CallbackRefused: the callback URL is not allowed.
            PermissionDenied, ModelNotFound, RateLimited: as for ``/v1/images/generations``.
            TooManyJobs: the key holds as many jobs as it may.
            StateStoreUnavailable: the job store cannot be reached.
        """
        principal = ctx.principal
        if principal is None:
            raise RuntimeError("a job submitted without an authenticated principal")
        triton_model, request = await self.tasks.resolve_image(
            ctx, request
        )  # stored with the model's defaults
        if callback_url:
            await self.policy.addresses(self.policy.check_url(callback_url))
        await self.tasks.service.admission.check(ctx, triton_model)
        job = Job(
            id=new_job_id(),
            owner=principal.client_id,
            kind=principal.kind,
            tier=principal.tier,
            scopes=tuple(sorted(principal.scopes)),
            model=triton_model,
            request={**request.to_json(), "response_format": response_format},
            created_at=self.clock(),
            callback_url=callback_url or "",
        )
        await self.store.submit(
            job, max_active=self.limits.max_active_per_key, max_kept=self.limits.max_kept_per_key
        )
        self.wake()
        return job

    async def _find(self, ctx: RequestContext, job_id: str, *, admin_too: bool) -> Job:
        principal = ctx.principal
        job = await self.store.get(job_id) if looks_like_job_id(job_id) else None
        if (
            job is None
            or principal is None
            or not (job.owner == principal.client_id or (admin_too and _is_admin(principal)))
        ):
            raise NotFound(
                f"no job '{job_id[:64]}' for this credential (jobs expire, and only their owner may "
                "use them)",
                field="job_id",
            )
        return job

    async def get(self, ctx: RequestContext, job_id: str) -> Job:
        """The caller's job (any job for the admin).

        Raises:
            NotFound: no such job for this caller.
        """
        return await self._find(ctx, job_id, admin_too=True)

    async def list_jobs(self, ctx: RequestContext, limit: int = 20) -> list[Job]:
        """The caller's jobs, newest first (everyone's for the admin)."""
        principal = ctx.principal
        owner = None if _is_admin(principal) else (principal.client_id if principal else "")
        return await self.store.list_jobs(owner, max(1, min(limit, MAX_LISTED)))

    async def cancel(self, ctx: RequestContext, job_id: str) -> Job:
        """Cancel the caller's queued or running job.

        Raises:
            NotFound: no such job for this caller. JobNotFinished: it has finished already (409).
        """
        job = await self._find(ctx, job_id, admin_too=False)
        if job.status.finished:
            raise JobNotFinished(
                f"job '{job.id}' has already ended ({job.status.value}); only queued or running "
                "jobs can be cancelled",
                field="job_id",
            )
        cancelled = await self.store.cancel(job.id)
        if cancelled is None:
            raise NotFound(f"no job '{job.id}' for this credential", field="job_id")
        return cancelled

    async def delete(self, ctx: RequestContext, job_id: str) -> None:
        """Delete the caller's finished job and its images.

        Raises:
            NotFound: no such job for this caller. JobNotFinished: it is queued or running (cancel it first).
        """
        job = await self._find(ctx, job_id, admin_too=False)
        if not job.status.finished or not await self.store.delete(job.id):
            raise JobNotFinished(
                f"job '{job.id}' is {job.status.value}; cancel it before deleting it",
                field="job_id",
            )

    async def signed_result(self, job_id: str) -> JobResult:
        """A succeeded job's images for a signed URL (the route checked the signature: no owner here).

        Raises:
            NotFound: no such job, or it has expired or been deleted. JobNotFinished: it has not succeeded.
        """
        job = await self.store.get(job_id) if looks_like_job_id(job_id) else None
        if job is None:
            raise NotFound(
                f"no job '{job_id[:64]}' (jobs expire, and deleting one removes its images)",
                field="job_id",
            )
        return await self._result(job)

    async def result(self, ctx: RequestContext, job_id: str) -> JobResult:
        """The images of the caller's succeeded job.

        Raises:
            NotFound: no such job for this caller. JobNotFinished: it has not succeeded (409).
        """
        return await self._result(await self._find(ctx, job_id, admin_too=False))

    async def _result(self, job: Job) -> JobResult:
        if job.status is not JobStatus.SUCCEEDED:
            why = f": {job.error.message}" if job.error is not None else ""
            raise JobNotFinished(
                f"job '{job.id}' is {job.status.value}{why}; a result exists once it has succeeded",
                field="job_id",
            )
        images = await self.store.images(job.id)
        if len(images) != job.images:
            raise NotFound(f"job '{job.id}' has expired", field="job_id")
        return JobResult(job, images, str(job.request.get("response_format", "b64_json")))
