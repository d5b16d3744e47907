"""The collector's pauses, timed in the collector and observed outside it, and the start-up freeze."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys

from gateway.observe.gc_pauses import GcPauses
from gateway.observe.metrics import GatewayMetrics


def test_each_collection_is_kept_with_its_generation_until_drained() -> None:
    pauses = GcPauses()
    pauses.install()
    pauses.install()  # once only
    try:
        gc.collect(1)
        gc.collect(2)
        taken = pauses.drain()
    finally:
        pauses.remove()
    # Collections the interpreter started itself may come between; these two are there, in order.
    generations = [g for g, _ in taken]
    assert generations.count(2) >= 1 and 1 in generations[: generations.index(2) + 1]
    assert all(seconds >= 0.0 for _, seconds in taken)
    assert pauses.drain() == []
    gc.collect()
    assert pauses.drain() == []  # removed: nothing is timed any more


def test_pauses_reach_the_histogram_and_the_last_ones_at_cancel() -> None:
    metrics = GatewayMetrics()
    pauses = GcPauses()

    async def scenario() -> None:
        pauses.install()
        task = asyncio.create_task(pauses.observe_forever(metrics.observe_gc_pause, 0.01))
        gc.collect(2)
        await asyncio.sleep(0.1)  # a few drains
        before = _count(metrics, "2")
        assert before >= 1
        gc.collect(2)
        task.cancel()  # before the next drain: the cancel drains what is left
        await asyncio.gather(task, return_exceptions=True)
        assert _count(metrics, "2") >= before + 1

    try:
        asyncio.run(scenario())
    finally:
        pauses.remove()
    assert b"gateway_gc_pause_seconds_bucket" in metrics.metrics_text()


def _count(metrics: GatewayMetrics, generation: str) -> float:
    value = metrics.registry.get_sample_value(
        "gateway_gc_pause_seconds_count", {"generation": generation}
    )
    return value or 0.0


def test_start_up_objects_are_frozen_out_of_the_collectors_sight() -> None:
    # In a process of its own: a frozen object is never collected, which the test process must not
    # do to the objects of every app its tests build.
    script = (
        "import gc\n"
        "from gateway.observe.gc_pauses import freeze_startup_objects\n"
        "kept = [object.__new__(type('Built', (), {})) for _ in range(100)]\n"
        "frozen = freeze_startup_objects()\n"
        "later = [[] for _ in range(10)]\n"
        "tracked = {id(o) for o in gc.get_objects()}\n"
        "print(frozen, id(kept) in tracked, id(later) in tracked)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert int(out[0]) > 1000 and out[1:] == ["False", "True"]
