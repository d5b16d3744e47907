"""The closed loop: ``concurrency`` workers each send a request, wait for its answer, send the next.

:func:`closed_loop` runs in the caller's event loop (tests that do other things meanwhile: kill a
server, poll a gauge). :func:`run` runs one or more :class:`LoadSpec` side by side in several
processes, so that one Python process's event loop is never the limit: every process opens its
clients first, all start at one instant the parent gives them (so a process a busy machine wakes late starts
late, not its window), each drives its share of every spec's
concurrency, and the samples are merged. Only requests that complete inside the measured window
(after the warm-up, before the end) count, in every process the same window.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.loadgen.samples import (
    TRANSPORT_FAILURE,
    LoadResult,
    Samples,
    summarize,
    summarize_windows,
)
from loadtest.loadgen.targets import Send, Target

__all__ = ["LoadError", "LoadRun", "LoadSpec", "closed_loop", "merge_runs", "run", "run_load"]

SETUP_TIMEOUT_S = 300.0  # spawning a process and opening its clients, on a busy machine
_START_MARGIN_S = 0.05  # from the start signal to the common start: time for every process to wake
_NO_ANSWER_PAUSE_S = 0.01  # a refused connection must not become a busy loop


class LoadError(RuntimeError):
    """The load could not run (a worker process failed or a target could not be opened)."""


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """One closed loop: which target, how many requests in flight, for how long.

    Args:
        warmup_s: sent but not measured (connections, caches, the dynamic batcher settle).
        honour_retry_after: a worker refused with 429/503 and Retry-After waits that long (a polite
            client); otherwise it sends again at once (the worst case).
        name: for tables; the target's name when empty.
    """

    target: Target
    concurrency: int
    duration_s: float
    warmup_s: float = 0.0
    honour_retry_after: bool = False
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.target.name


@dataclass(frozen=True)
class LoadRun:
    """A spec's merged samples and the window they were measured in."""

    spec: LoadSpec
    samples: Samples
    window: tuple[float, float]
    processes: int
    #: CPU seconds the load's own processes spent inside the window (0 where not measured: a spec
    #: that shares its processes with others, or one driven in the caller's process)
    cpu_s: float = 0.0

    def result(self) -> LoadResult:
        return summarize(
            self.samples, self.spec.label, self.spec.concurrency, self.processes, self.window
        )

    def measured(self) -> Samples:
        """The samples that completed inside the window."""
        t1 = self.samples.t1
        return self.samples.where((t1 >= self.window[0]) & (t1 <= self.window[1]))


def merge_runs(runs: Sequence[LoadRun]) -> LoadResult:
    """One result for several runs of the same spec (rounds taken in turn with other loads).

    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("merge_runs needs at least one run")
    first = runs[0]
    return summarize_windows(
        [(r.samples, r.window) for r in runs],
        first.spec.label,
        first.spec.concurrency,
        first.processes,
    )


async def _drive(
    send: Send, spec: LoadSpec, concurrency: int, start: float, stop: asyncio.Event | None = None
) -> Samples:
    measure_from = start + spec.warmup_s
    stop_at = measure_from + spec.duration_s
    rows: list[tuple[float, float, int, float | None, bool | None]] = []
    messages: dict[int, str] = {}

    async def worker(number: int) -> None:
        index = number
        while not (stop is not None and stop.is_set()):
            t0 = time.monotonic()
            if t0 >= stop_at:
                return
            status, retry_after, correct, message = await send(number, index)
            t1 = time.monotonic()
            index += concurrency
            if t1 >= measure_from:
                rows.append((t0, t1 - t0, status, retry_after, correct))
                if message is not None and status not in messages:
                    messages[status] = message
            if status == TRANSPORT_FAILURE:
                await asyncio.sleep(_NO_ANSWER_PAUSE_S)
            elif spec.honour_retry_after and retry_after is not None and status in (429, 503):
                await asyncio.sleep(min(retry_after, max(0.0, stop_at - time.monotonic())))

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return Samples.from_rows(rows, messages)


async def closed_loop(
    target: Target,
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.0,
    stop: asyncio.Event | None = None,
    honour_retry_after: bool = False,
) -> Samples:
    """Drive ``target`` from this event loop; every request completed after the warm-up is a sample.

    Args:
        stop: ends the loop early when set (workers finish the request they are in).
    """
    spec = LoadSpec(
        target=target,
        concurrency=concurrency,
        duration_s=duration_s,
        warmup_s=warmup_s,
        honour_retry_after=honour_retry_after,
    )
    async with target.connect(concurrency) as send:
        return await _drive(send, spec, concurrency, time.monotonic(), stop)


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


@dataclass(frozen=True)
class _StartSignal:
    """How the processes of one run start together: each passes ``ready`` (the parent too) once its
    clients are open; the parent then writes one start time into ``start_at`` and sets ``go``. All
    processes load from that instant, so every process's window is the same one, however late a busy
    machine wakes a process (its first requests then start late, not its window)."""

    ready: Any
    go: Any
    start_at: Any


class _WindowCpu:
    """This process's CPU seconds between two instants of the monotonic clock, read by timers on
    the event loop (a busy loop reads them late, by its lag)."""

    def __init__(self) -> None:
        self.readings: list[float] = []

    def arm(self, start: float, stop: float) -> None:
        loop = asyncio.get_running_loop()
        offset = loop.time() - time.monotonic()  # the loop's clock may differ from time.monotonic
        for at in (start, stop):
            loop.call_at(at + offset, lambda: self.readings.append(time.process_time()))

    def seconds(self) -> float:
        """The window's CPU seconds, once the load has ended: a stop timer that had not run yet
        (uvloop's clock ticks in milliseconds) is read now. 0 where the window was never armed."""
        if len(self.readings) == 1:
            self.readings.append(time.process_time())
        return self.readings[1] - self.readings[0] if len(self.readings) == 2 else 0.0


async def _process_share(
    jobs: list[tuple[LoadSpec, int]], signal: _StartSignal | None
) -> tuple[float, list[Samples], float]:
    async with contextlib.AsyncExitStack() as stack:
        # A process with no share of a spec opens no clients for it (apart: one spec per process).
        sends = [
            await stack.enter_async_context(spec.target.connect(share)) if share > 0 else None
            for spec, share in jobs
        ]
        start = time.monotonic()
        if signal is not None:
            await asyncio.to_thread(signal.ready.wait, SETUP_TIMEOUT_S)
            if not await asyncio.to_thread(signal.go.wait, SETUP_TIMEOUT_S):
                raise LoadError("the load processes were not told to start")
            start = signal.start_at.value
            await asyncio.sleep(max(0.0, start - time.monotonic()))
        cpu = _WindowCpu()
        mine = [spec for spec, share in jobs if share > 0]
        if len(mine) == 1:  # one spec: its window is this process's
            cpu.arm(start + mine[0].warmup_s, start + mine[0].warmup_s + mine[0].duration_s)
        parts = await asyncio.gather(
            *(
                _drive(send, spec, share, start)
                for send, (spec, share) in zip(sends, jobs, strict=True)
                if send is not None
            )
        )
    done = iter(parts)
    return start, [next(done) if share > 0 else Samples() for _, share in jobs], cpu.seconds()


def _child(
    number: int, jobs: list[tuple[LoadSpec, int]], signal: _StartSignal, results: Any
) -> None:
    try:
        results.put((number, asyncio.run(_process_share(jobs, signal)), None))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, which raises it
        with contextlib.suppress(Exception):
            signal.ready.abort()
        results.put((number, None, traceback.format_exc()))


def run(specs: Sequence[LoadSpec], processes: int = 1, *, apart: bool = False) -> list[LoadRun]:
    """Run ``specs`` side by side, each spec's concurrency split over ``processes`` processes.

    Args:
        apart: each spec in a child process of its own instead (``processes`` is then ignored; one
            spec too runs in a child), so one spec's clients never share an event loop with
            another's, nor with the caller's (a measured load beside a hostile one, measured the
            same way alone).

    Raises:
        LoadError: a process could not open its targets or failed, with its traceback.
    """
    if apart:
        plan = [
            [(spec, spec.concurrency if k == own else 0) for k, spec in enumerate(specs)]
            for own in range(len(specs))
        ]
        processes = len(specs)
    else:
        processes = max(1, min(processes, max(spec.concurrency for spec in specs)))
        plan = [
            [(spec, share) for spec, share in zip(specs, column, strict=True)]
            for column in zip(
                *(_shares(spec.concurrency, processes) for spec in specs), strict=True
            )
        ]
    if processes == 1 and not apart:
        try:
            start, parts, _ = asyncio.run(_process_share(plan[0], None))
            outcomes = [(start, parts, 0.0)]  # the caller's process: its CPU is not the load's
        except Exception as exc:
            raise LoadError(f"the load could not run: {type(exc).__name__}: {exc}") from exc
    else:
        outcomes = _run_processes(plan, max(s.warmup_s + s.duration_s for s in specs))
    starts = [start for start, _, _ in outcomes]
    runs = []
    for k, spec in enumerate(specs):
        # The processes that drove this spec; their CPU is the spec's only if they drove it alone.
        drivers = [
            (jobs, cpu) for (_, _, cpu), jobs in zip(outcomes, plan, strict=True) if jobs[k][1]
        ]
        alone = all(_alone(jobs, k) for jobs, _ in drivers)
        # The window every process was loading in: from the last start's warm-up end to the first end.
        window = (max(starts) + spec.warmup_s, min(starts) + spec.warmup_s + spec.duration_s)
        runs.append(
            LoadRun(
                spec,
                Samples.concat([parts[k] for _, parts, _ in outcomes]),
                window,
                1 if apart else processes,
                sum(cpu for _, cpu in drivers) if alone else 0.0,
            )
        )
    return runs


def _alone(jobs: list[tuple[LoadSpec, int]], k: int) -> bool:
    """Whether a process with ``jobs`` drove no spec but ``k``."""
    return all(share == 0 for j, (_, share) in enumerate(jobs) if j != k)


def _run_processes(
    plan: list[list[tuple[LoadSpec, int]]], seconds: float
) -> list[tuple[float, list[Samples], float]]:
    context = multiprocessing.get_context("spawn")  # no inherited event loop, threads or clients
    signal = _StartSignal(context.Barrier(len(plan) + 1), context.Event(), context.Value("d", 0.0))
    results = context.Queue()
    children = [
        context.Process(target=_child, args=(k, jobs, signal, results), daemon=True)
        for k, jobs in enumerate(plan)
    ]
    for child in children:
        child.start()
    try:
        signal.ready.wait(SETUP_TIMEOUT_S)
    except threading.BrokenBarrierError:
        pass  # a process failed to open its clients: its traceback arrives on the results queue
    else:
        # CLOCK_MONOTONIC is one clock for every process of the host.
        signal.start_at.value = time.monotonic() + _START_MARGIN_S
        signal.go.set()
    collected: dict[int, tuple[float, list[Samples], float]] = {}
    deadline = time.monotonic() + SETUP_TIMEOUT_S + seconds + 60
    try:
        while len(collected) < len(children):
            try:
                number, outcome, error = results.get(timeout=1.0)
            except queue.Empty:
                dead = [c for c in children if c.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise LoadError(
                        f"load process exited with code {dead[0].exitcode}"
                        if dead
                        else "the load processes did not finish in time"
                    ) from None
                continue
            if error is not None:
                raise LoadError(f"load process {number} failed:\n{error}")
            collected[number] = outcome
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()
    return [collected[k] for k in range(len(children))]


def run_load(spec: LoadSpec, processes: int = 1) -> LoadResult:
    """:func:`run` for one spec, summarised."""
    return run([spec], processes)[0].result()
