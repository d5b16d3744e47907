"""Which requests of a ragged batch run together (the Python-based backends' batching core).

An input whose config sets ``allow_ragged_batch`` lets Triton's dynamic batcher put requests of
different lengths in one execution. The core sorts them by length (axis 1 of their ragged inputs),
groups them, zero-pads each group's ragged inputs to the group's longest and runs each group once.
This module picks the groups: with the config parameter ``ragged_run_cost`` (what one run costs, in
padded positions), the split of the sorted requests that costs least in all (run costs plus positions
computed): on a CPU, where a padded position costs about what a run does, nearly one group per
length; on a GPU, where a run costs thousands of positions, one group. Otherwise by the edges of
``ragged_length_buckets`` (e.g. ``"16,32,64,128"``; neither parameter: one group).

It imports nothing of Triton, so it is a plain module; like ``batching_core.py`` it is copied beside
each backend's ``model.py`` (``serving.launcher.assemble_backends``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Pending", "cheapest_groups", "length_groups"]


@dataclass
class Pending:
    """A request read and checked, waiting for its run: its inputs, rows and ragged length."""

    index: int
    arrays: list[Any]
    size: int
    length: int = 0  # axis 1 of the ragged inputs (0: none)


def length_groups(
    pending: list[Pending], length_buckets: Sequence[int], run_cost: float
) -> list[list[Pending]]:
    """The ragged requests that run together, shortest first: the cheapest split when ``run_cost`` > 0,
    else one group per edge of ``length_buckets`` (sorted; longer than every edge: one last group)."""
    ordered = sorted(pending, key=lambda p: p.length)
    if run_cost > 0:
        return cheapest_groups(ordered, run_cost)
    groups: dict[int, list[Pending]] = {}
    for item in ordered:
        bucket = next((edge for edge in length_buckets if item.length <= edge), 0)
        groups.setdefault(bucket, []).append(item)
    return list(groups.values())


def cheapest_groups(ordered: list[Pending], run_cost: float) -> list[list[Pending]]:
    """Runs of the length-sorted requests that cost least in all: each run costs ``run_cost`` plus its
    rows times its longest length (padded positions computed). Exact, by dynamic programming over the
    cut points (a batch holds at most ``max_batch_size`` requests)."""
    count = len(ordered)
    best, cut = [0.0] + [float("inf")] * count, [0] * (count + 1)
    for end in range(1, count + 1):
        rows = 0
        for start in range(end - 1, -1, -1):
            rows += ordered[start].size
            cost = best[start] + run_cost + rows * ordered[end - 1].length
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], count
    while end > 0:
        groups.append(ordered[cut[end] : end])
        end = cut[end]
    return groups[::-1]
