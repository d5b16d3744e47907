"""Batches that arrive one at a time -> a callback per batch, decode overlapping the GPU work.

:meth:`OverlappedPipeline.map` suits a caller that holds all its batches (the in-process benchmark):
it waits for batch ``n - 1`` only once batch ``n`` is queued. A server gets its batches one by one
(Triton calls ``execute()`` with the next batch only after the last call returned) and must answer
each batch as soon as it is done, not when the next one arrives. :class:`StreamingPipeline` takes a
batch with :meth:`~StreamingPipeline.submit`, which returns at once, and calls the batch's ``done``
from its own thread when the outputs are on the host:

    caller (execute):  submit(batch, done), then wait_for_room(): returns once fewer than ``depth``
                       batches are in flight, so that the rest wait in Triton's queue (where its
                       queue policy, timeouts and priorities apply) and Triton's next batch is
                       formed only when the pipeline can take it
    decode thread:     headers -> nvJPEG                               (OverlappedPipeline's own)
    GPU thread:        resize + model of batch n queued; if batch n + 1 is decoded by then, it is
                       queued before n is waited for; else n is waited for at once (there is
                       nothing to overlap it with) and ``done(result)`` is called

So a server's Triton batch ``n + 1`` is decoded while batch ``n`` is resized and classified, the
overlap :class:`OverlappedPipeline` measures in process, instead of each ``execute()`` running its
steps one after another.

A batch that stays unanswered for ``stall_s`` means a thread is stuck (in a decoder or a CUDA call:
the overlapped way once never answered a truncated JPEG, ``benchmarks/h200/run11-gateway-rows``).
Nothing can unstick a thread, so a watchdog answers every unanswered batch with an error and the
pipeline refuses new ones: the waiting requests fail after ``stall_s`` instead of never, later ones
at once, and the failures are what the gateway's breaker counts before it reloads the model (a
fresh stub).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

try:  # beside a Triton model: the copies the build placed there
    from gpu_overlap import BatchResult, OverlappedPipeline, _InFlight
except ImportError:  # imported from the source tree
    from serving.gpu_overlap import BatchResult, OverlappedPipeline, _InFlight

__all__ = ["DEFAULT_STALL_S", "Done", "StreamingPipeline"]

log = logging.getLogger(__name__)

#: called once per submitted batch, from the pipeline's GPU thread: the result, or why there is none
Done = Callable[[BatchResult | BaseException], None]

#: how long a blocked wait looks again whether the pipeline was closed
_POLL_S = 0.05

#: how long a batch may stay unanswered before the pipeline is declared stuck: far above any batch's
#: time under load (a P99 of 0.2 s at 256 in flight, H200 run 11), far below a client's timeout
DEFAULT_STALL_S = 30.0

#: how long closing a stuck pipeline waits for its threads (the model's unload waits that long)
_STUCK_JOIN_S = 5.0


class StreamingPipeline(OverlappedPipeline):
    """An :class:`OverlappedPipeline` fed one batch at a time (see the module docstring).

    Args:
        *args, **kwargs: as :class:`OverlappedPipeline`.
        depth: batches submitted and not yet answered before :meth:`submit` blocks (2: one decoded
            while the one before is on the GPU).
        stall_s: a batch unanswered for this long stops the pipeline (see the module docstring).
    """

    def __init__(
        self, *args: Any, depth: int = 2, stall_s: float = DEFAULT_STALL_S, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._mapping = True  # map() would compete with the GPU thread for the decoded batches
        self._in_flight = threading.BoundedSemaphore(depth)
        # Each unanswered batch's callback and when it was submitted (monotonic), in submission
        # order: the first entry is the oldest, the one the watchdog looks at.
        self._waiting: dict[int, tuple[Done, float]] = {}
        self._lock = threading.Lock()
        self._submitted = 0
        self._draining = False
        self._stalled: str | None = None  # why the pipeline stopped taking batches
        self._gpu_thread = threading.Thread(
            target=self._gpu_loop, name="gpu-overlap-stream", daemon=True
        )
        self._gpu_thread.start()
        self._watchdog = threading.Thread(
            target=self._watch, args=(stall_s,), name="gpu-overlap-watchdog", daemon=True
        )
        self._watchdog.start()

    def submit(self, encoded: Sequence[torch.Tensor], done: Done) -> None:
        """Queue one batch of encoded images (contiguous host ``uint8`` tensors, one image each);
        ``done`` gets its :class:`BatchResult` (or the exception that stopped it) from another thread.

        Raises:
            ValueError: the batch is empty or larger than the largest prepared size.
            RuntimeError: the pipeline is closing, or stuck (see the module docstring).
        """
        if not 1 <= len(encoded) <= self.max_batch:
            raise ValueError(f"a batch of {len(encoded)} images is outside 1..{self.max_batch}")
        self._take_slot()
        with self._lock:
            if self._stalled or self._draining or self._closed.is_set():
                self._in_flight.release()
                raise RuntimeError(self._stalled or "the pipeline is closing")
            index = self._submitted
            self._submitted += 1
            self._waiting[index] = (done, time.monotonic())
            self._todo.put((index, list(encoded)))

    def wait_for_room(self) -> None:
        """Block until fewer than ``depth`` batches are in flight (at once if they are).

        A server calls it after :meth:`submit`, before it takes its next batch: Triton forms a batch
        when ``execute()`` returns, so returning only once there is room lets that batch gather
        the requests that arrived meanwhile, instead of being formed early and small and then waiting.

        Raises:
            RuntimeError: the pipeline is closing, or stuck (see the module docstring).
        """
        self._take_slot()
        self._in_flight.release()

    def _take_slot(self) -> None:
        """One of the ``depth`` in-flight places, waiting for it (without the GIL) until one is free.

        Raises:
            RuntimeError: the pipeline is closing, or stuck (see the module docstring).
        """
        while not self._in_flight.acquire(timeout=_POLL_S):
            if self._stalled:
                raise RuntimeError(self._stalled)
            if self._draining or self._closed.is_set():
                raise RuntimeError("the pipeline is closing")

    def warm_up(self, timeout_s: float = 120.0) -> None:
        """Run one small JPEG through every step and wait for it: the decoder's and the threads' lazy
        start (1.7 s for the first batch on an H100, run 9) is paid at load, not by the first requests.

        Raises:
            RuntimeError: the image was not answered within ``timeout_s``, or failed.
        """
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (64, 48), (128, 96, 64)).save(buffer, format="JPEG")
        answered: list[BatchResult | BaseException] = []
        done = threading.Event()

        def keep(result: BatchResult | BaseException) -> None:
            answered.append(result)
            done.set()

        self.submit([torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)], keep)
        if not done.wait(timeout_s):
            raise RuntimeError(f"the warm-up image was not answered within {timeout_s:g} s")
        if isinstance(answered[0], BaseException) or answered[0].rows != [0]:
            raise RuntimeError(f"the warm-up image failed: {answered[0]}")

    def close(self, timeout_s: float = 60.0) -> None:
        """Answer what was submitted (within ``timeout_s``), then stop both threads (idempotent).
        A batch still unanswered then gets a ``RuntimeError``."""
        with self._lock:
            first = not self._draining
            self._draining = True
            if first:
                self._todo.put(None)  # after every submitted batch: the decode thread ends there
        if not self._stalled:
            self._gpu_thread.join(timeout_s)  # the watchdog may find a thread stuck meanwhile
        if self._stalled:
            # A thread stuck for good ends with its process; one that was only slow ends here, so
            # that no thread is still inside torch when the interpreter shuts down (an abort).
            self._closed.set()
            self._todo.put(None)
            for thread in (self._gpu_thread, self._worker):
                thread.join(min(timeout_s, _STUCK_JOIN_S))
        else:
            super().close()
            self._gpu_thread.join(timeout_s)
        with self._lock:
            left, self._waiting = self._waiting, {}
        for done, _ in left.values():
            self._call(done, RuntimeError("the pipeline closed before this batch was answered"))

    # ------------------------------------------------------------------ the GPU thread

    def _gpu_loop(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.device)
        pending: deque[_InFlight] = deque()
        with torch.inference_mode():
            while True:
                try:
                    # With a batch on the GPU, only a batch already decoded is worth waiting for.
                    item = self._decoded.get(block=not pending, timeout=_POLL_S)
                except queue.Empty:
                    if pending:
                        self._finish(pending.popleft())
                    elif not self._worker.is_alive() and self._decoded.empty():
                        return
                    continue
                if item.failure is not None:
                    self._answer(item.index, item.failure)
                    continue
                started = time.perf_counter()
                try:
                    pending.append(self._queue_gpu(item))
                    item.steps_ms["queue_gpu"] = (time.perf_counter() - started) * 1000.0
                except Exception as exc:  # this batch fails; the others go on
                    log.exception("queueing batch %d on the GPU failed", item.index)
                    self._answer(item.index, exc)
                    continue
                # Batch n is queued: batch n - 1 (another slot) can be waited for and answered.
                while len(pending) > 1:
                    self._finish(pending.popleft())

    def _finish(self, flight: _InFlight) -> None:
        started = time.perf_counter()
        try:
            result: BatchResult | BaseException = self._collect(flight)
            flight.steps_ms["wait_gpu"] = (time.perf_counter() - started) * 1000.0
        except Exception as exc:
            log.exception("collecting batch %d failed", flight.index)
            result = exc
        self._answer(flight.index, result)

    def _answer(self, index: int, result: BatchResult | BaseException) -> None:
        with self._lock:
            waiting = self._waiting.pop(index, None)
        self._in_flight.release()  # before the callback: the next batch can be submitted meanwhile
        if waiting is not None:
            self._call(waiting[0], result)

    # ------------------------------------------------------------------ the watchdog

    def _watch(self, stall_s: float) -> None:
        """Answer every batch with an error once one has waited ``stall_s`` (then stop taking any)."""
        while not self._closed.wait(min(1.0, stall_s / 4)):
            now = time.monotonic()
            with self._lock:
                oldest = next(iter(self._waiting.items()), None)
                if oldest is None or now - oldest[1][1] < stall_s:
                    continue
                self._stalled = (
                    f"the GPU pipeline is stuck: batch {oldest[0]} was not answered within "
                    f"{stall_s:g} s; the model must be loaded again"
                )
                left, self._waiting = self._waiting, {}
            log.error("%s (%d batches answered with this error)", self._stalled, len(left))
            for done, _ in left.values():
                # Their slots stay taken: the stuck thread may still give one back, and no new
                # batch is taken anyway.
                self._call(done, RuntimeError(self._stalled))
            return

    @staticmethod
    def _call(done: Done, result: BatchResult | BaseException) -> None:
        try:
            done(result)
        except Exception:  # one batch's answer must not stop the thread that answers the others
            log.exception("a batch's done callback failed")
