"""Parsing big REST bodies in worker processes, so that no one body holds a serving process.

A KServe v2 JSON body's parse is almost all ``json`` decoding (C code that holds the GIL: about
40 ms per MiB of FP32 values on the 2-core CI machine, 0.5 s for 15 MB), so in a thread of the
serving process it still stops the event loop, and every tenant's requests and the health checks
with it. In a worker process the serving process only copies the body out and the checked arrays
back (``python -m loadtest.parse_bench`` prints both ways side by side, with the loop's lag).

The body does not travel through the pool's pipe: pickling 15 MB into it holds the GIL of the
serving process for 10-20 ms. It is written (in a thread; a write releases the GIL) to a private
temporary file in memory (``/dev/shm`` where there is one), which the worker reads and the serving
process removes once the parse has ended.

The pool is the app's (built in its lifespan, shut down with it); its workers are spawned, not
forked (the serving process has threads), when the first big bodies come (a gateway that never gets
one never starts them; the first one waits for a worker's start, about a second, off the loop). The
errors are the same :class:`~gateway.errors.BadRequest` the parse raises in process: the worker runs
exactly :func:`gateway.protocol.kserve._rest.parse_rest`.

The same pool decodes the other APIs' big JSON bodies (:meth:`ParsePool.run` with any picklable
function of the body's bytes: the OpenAI routes send ``json.loads``, :mod:`gateway.routes._pooled_json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from pathlib import Path
from typing import TypeVar

from gateway.errors import ServiceUnavailable
from gateway.protocol.kserve._rest import ParseLimits, parse_rest
from gateway.protocol.kserve._types import InferRequest

__all__ = ["ParsePool"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: where bodies wait for their worker: memory, where the system has it
_SPILL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _spill(body: bytes) -> str:
    """Write ``body`` to a new file only this user can read; returns its path."""
    fd, path = tempfile.mkstemp(prefix="gateway-body-", dir=_SPILL_DIR)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(body)
    except BaseException:
        os.unlink(path)
        raise
    return path


def _run_file(work: Callable[[bytes], T], path: str) -> T:
    """What a worker runs: ``work`` of the body in ``path``."""
    return work(Path(path).read_bytes())


class ParsePool:
    """Worker processes that parse REST bodies (:func:`parse_rest`) for the serving process.

    Args:
        workers: how many processes (bodies parsed at once; the others wait without holding the loop).
        retry_after_s: the ``Retry-After`` of the 503 when a worker died under a body.
    """

    def __init__(self, workers: int, retry_after_s: float = 1) -> None:
        if workers < 1:
            raise ValueError("a parse pool needs at least one worker")
        self.workers = workers
        self.retry_after_s = retry_after_s
        self._executor: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Make the pool (its processes start with the first bodies it is given)."""
        self._executor = ProcessPoolExecutor(
            self.workers, mp_context=multiprocessing.get_context("spawn")
        )

    async def parse(
        self, body: bytes, header_length: str | None, limits: ParseLimits
    ) -> InferRequest:
        """:func:`parse_rest` of ``body``, run in a worker process.

        Raises:
            BadRequest: the body is malformed (as :func:`parse_rest` raises it).
            ServiceUnavailable: the worker died under this body (the pool is started again).
        """
        return await self.run(partial(parse_rest, header_length=header_length, limits=limits), body)

    async def run(self, work: Callable[[bytes], T], body: bytes) -> T:
        """``work(body)`` in a worker process; its result (or exception) comes back pickled.

        Args:
            work: a picklable function of the body's bytes (a module-level function or a
                ``functools.partial`` of one).
            body: the request body.

        Raises:
            ServiceUnavailable: the worker died under this body (the pool is started again).
            Exception: whatever ``work`` raised.
        """
        if self._executor is None:
            raise RuntimeError("the parse pool is not started")
        executor = self._executor
        path = await asyncio.to_thread(_spill, body)
        try:
            return await asyncio.wrap_future(executor.submit(_run_file, work, path))
        except BrokenProcessPool:
            log.error("a body parser process died; the pool is started again")
            if self._executor is executor:
                executor.shutdown(wait=False, cancel_futures=True)
                self.start()
            raise ServiceUnavailable(
                "the request body's parser stopped while reading it; retry shortly",
                retry_after_s=self.retry_after_s,
            ) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        """Stop the workers (parses not yet begun are dropped; one under way is waited for)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
