"""Generation jobs in Redis: shared by every replica and worker, surviving any of them.

Under the gateway's prefix ``<p>`` (``GATEWAY_REDIS_PREFIX``), beside keys, canary weights and the
rest (:mod:`gateway.tenancy.redis_state`):

===============================  ======  ==========================================================
key                              type    holds
===============================  ======  ==========================================================
``<p>jobs:<id>``                 hash    the job (:meth:`gateway.jobs.store.Job.to_fields`)
``<p>jobs:<id>:images``          list    its result images, in order
``<p>jobs:due``                  zset    unfinished jobs: a queued one scored by when it may be
                                         claimed, a running one by the end of its worker's lease
``<p>jobs:callbacks``            zset    finished jobs whose callback is pending, by when it is due
``<p>jobs:owner:<client>``       zset    one owner's jobs, scored by expiry (``+inf`` unfinished)
``<p>jobs:all``                  zset    every job, scored by expiry (for the admin's listing)
``<p>jobs:created``              zset    every job, scored by creation time (newest first)
===============================  ======  ==========================================================

Every change is one Lua script (:mod:`gateway.jobs.store_redis_scripts`), so it is atomic: a claim
takes the first due job and moves its score to the end of a new lease in one step, so two workers can
never run the same job, and a job whose worker died (its lease ran out) becomes due again by itself.
A finished job's hash and images expire (``PEXPIREAT``) ``ttl_s`` after it finished, and its index
entries are trimmed when they pass that time. The scripts compute the keys of the job they pick from
the prefix, so they need one Redis (or one Redis Cluster hash slot), as the gateway's other scripts
do.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from gateway.jobs.redis_calls import open_redis, redis_call
from gateway.jobs.store import (
    CallbackState,
    Job,
    JobStatus,
    JobStore,
    Outcome,
    limit_reached,
    lost_error,
)
from gateway.jobs.store_redis_scripts import SCRIPTS

__all__ = ["RedisJobStore"]

T = TypeVar("T")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job(flat: Sequence[Any] | dict[Any, Any] | None) -> Job | None:
    """A job from HGETALL's answer (a dict from redis-py, a flat list from a script)."""
    if not flat:
        return None
    if isinstance(flat, dict):
        fields = {_text(k): _text(v) for k, v in flat.items()}
    else:
        fields = {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}
    return Job.from_fields(fields)


class RedisJobStore(JobStore):
    """Jobs in Redis (see the module docstring).

    Args:
        url: a ``redis://`` URL.
        ttl_s: how long a finished job and its images are kept.
        prefix: the gateway's key namespace.
        timeout_s: connect timeout (commands get a little more: results carry images).
        clock: wall-clock seconds.
    """

    def __init__(
        self,
        url: str,
        ttl_s: float,
        *,
        prefix: str = "gw:",
        timeout_s: float = 0.25,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self._redis = open_redis(url, timeout_s)
        self._p = prefix
        self._clock = clock
        self._scripts = {name: self._redis.register_script(body) for name, body in SCRIPTS.items()}

    def _key(self, job_id: str) -> str:
        return f"{self._p}jobs:{job_id}"

    async def _call(self, call: Awaitable[T]) -> T:
        return await redis_call("job store", call)

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._call(self._scripts[name](keys=keys, args=args))

    async def submit(self, job: Job, *, max_active: int, max_kept: int) -> None:
        p = self._p
        fields = [item for pair in job.to_fields().items() for item in pair]
        what, count = await self._script(
            "submit",
            [
                self._key(job.id),
                f"{p}jobs:owner:{job.owner}",
                f"{p}jobs:all",
                f"{p}jobs:created",
                f"{p}jobs:due",
            ],
            [self._clock(), max_active, max_kept, job.id, repr(job.created_at), *fields],
        )
        what = _text(what)
        if what == "active":
            raise limit_reached("active", int(count), max_active)
        if what == "kept":
            raise limit_reached("kept", int(count), max_kept)

    def _visible(self, job: Job | None) -> Job | None:
        # Redis expires the hash on its own clock; this keeps the store's clock the one that counts.
        return (
            None
            if job is None or (job.expires_at is not None and job.expires_at <= self._clock())
            else job
        )

    async def get(self, job_id: str) -> Job | None:
        return self._visible(_job(await self._call(self._redis.hgetall(self._key(job_id)))))

    async def list_jobs(self, owner: str | None, limit: int) -> list[Job]:
        if owner is not None:  # at most the kept limit
            ids = await self._call(self._redis.zrange(f"{self._p}jobs:owner:{owner}", 0, -1))
        else:
            ids = await self._call(self._redis.zrevrange(f"{self._p}jobs:created", 0, 2 * limit))
        pipe = self._redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self._key(_text(job_id)))
        jobs = [
            j
            for j in (self._visible(_job(raw)) for raw in await self._call(pipe.execute()))
            if j is not None
        ]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)[:limit]

    async def claim(self, worker: str, lease_s: float, max_attempts: int) -> Job | None:
        error = lost_error(max_attempts).to_json()
        return _job(
            await self._script(
                "claim",
                [f"{self._p}jobs:due"],
                [self._p, self._clock(), lease_s, worker, max_attempts, self.ttl_s, error],
            )
        )

    async def renew(self, job_id: str, worker: str, lease_s: float) -> JobStatus | None:
        status = await self._script(
            "renew",
            [self._key(job_id), f"{self._p}jobs:due"],
            [job_id, worker, self._clock() + lease_s],
        )
        return JobStatus(_text(status)) if status else None

    async def release(self, job_id: str, worker: str, delay_s: float) -> bool:
        return bool(
            await self._script(
                "release",
                [self._key(job_id), f"{self._p}jobs:due"],
                [job_id, worker, self._clock() + delay_s],
            )
        )

    async def finish(self, job_id: str, worker: str, outcome: Outcome) -> bool:
        error = "" if outcome.error is None else outcome.error.to_json()
        return bool(
            await self._script(
                "finish",
                [self._key(job_id), self._key(job_id) + ":images"],
                [
                    self._p,
                    job_id,
                    worker,
                    self._clock(),
                    self.ttl_s,
                    outcome.status.value,
                    error,
                    outcome.media_type,
                    *outcome.images,
                ],
            )
        )

    async def cancel(self, job_id: str) -> Job | None:
        return _job(
            await self._script(
                "cancel", [self._key(job_id)], [self._p, job_id, self._clock(), self.ttl_s]
            )
        )

    async def delete(self, job_id: str) -> bool:
        job = await self.get(job_id)
        if job is None:
            return False
        p = self._p
        return bool(
            await self._script(
                "delete",
                [
                    self._key(job_id),
                    self._key(job_id) + ":images",
                    f"{p}jobs:owner:{job.owner}",
                    f"{p}jobs:all",
                    f"{p}jobs:created",
                    f"{p}jobs:callbacks",
                ],
                [job_id],
            )
        )

    async def images(self, job_id: str) -> list[bytes]:
        if await self.get(job_id) is None:
            return []
        stored = await self._call(self._redis.lrange(self._key(job_id) + ":images", 0, -1))
        return [i if isinstance(i, bytes) else i.encode() for i in stored]

    async def claim_callback(self, worker: str, lease_s: float) -> Job | None:
        now = self._clock()
        return _job(
            await self._script(
                "claim_callback", [f"{self._p}jobs:callbacks"], [self._p, now, now + lease_s]
            )
        )

    async def callback_done(
        self, job_id: str, state: CallbackState, error: str, retry_in_s: float | None
    ) -> None:
        retry = "" if retry_in_s is None else repr(self._clock() + retry_in_s)
        await self._script(
            "callback_done",
            [self._key(job_id), f"{self._p}jobs:callbacks"],
            [job_id, state.value, error, retry],
        )

    async def close(self) -> None:
        await self._redis.aclose()
