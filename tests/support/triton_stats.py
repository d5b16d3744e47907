"""Triton's statistics extension, read once they have settled.

Triton updates a model's statistics after the response has left, so a client that reads them right
after its last answer can see the previous count (63 of 64). Tests wait for the count they expect,
with a deadline, instead of reading once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Counts", "counts", "wait_for_counts"]


@dataclass(frozen=True)
class Counts:
    inferences: int  # successful inferences (batch elements)
    executions: int  # model executions (one per batch the model ran)
    successes: int  # successful requests
    failures: int  # failed requests

    @property
    def requests(self) -> int:
        return self.successes + self.failures

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            self.inferences - other.inferences,
            self.executions - other.executions,
            self.successes - other.successes,
            self.failures - other.failures,
        )


def counts(client: Any, model: str) -> Counts:
    """The model's counters now (``client``: a ``tritonclient.http`` client)."""
    stats = client.get_inference_statistics(model)["model_stats"][0]
    inference = stats["inference_stats"]
    return Counts(
        int(stats["inference_count"]),
        int(stats["execution_count"]),
        int(inference["success"]["count"]),
        int(inference["fail"]["count"]),
    )


def wait_for_counts(
    client: Any, model: str, before: Counts, requests: int, timeout_s: float = 30.0
) -> Counts:
    """The change since ``before`` once Triton has recorded ``requests`` more requests (or the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        change = counts(client, model) - before
        if change.requests >= requests or time.monotonic() > deadline:
            return change
        time.sleep(0.05)
