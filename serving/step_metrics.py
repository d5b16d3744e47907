"""Where a Python model's ``execute()`` spends its time, as Triton metrics.

Triton's statistics give a Python model's whole ``execute()`` as one number (``compute_infer``). A model
that times its own steps with :class:`StepTimes` splits it on Triton's ``/metrics`` page:

    python_model_step_seconds_total{model, version, step}   seconds spent in each step
    python_model_executions_total{model, version}          executions timed
    python_model_items_total{model, version}               items (images, rows) they carried

Two scrapes around a load point give each step's mean per execution (``loadtest.bench.triton_split``).
The sums are kept in the process and handed to Triton at most once per ``flush_s``: each increment
of a Triton custom metric (``pb_utils.MetricFamily``) is a message from the stub to the server, too
dear to send per execution. Where the stub has no custom metrics (an older Triton) the timing is off
and the model runs as before.

Shipped beside a Python model in its version folder (the stub imports it by file name).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["StepTimes"]

log = logging.getLogger(__name__)


class StepTimes:
    """Wall time per named step of ``execute()``, summed and flushed to Triton's custom metrics.

    Args:
        pb_utils: the stub's ``triton_python_backend_utils`` module.
        model: the model's name (a label).
        version: its version (a label).
        steps: the step names, in the order ``execute()`` runs them.
        flush_s: the shortest interval between two hand-overs to Triton.
        clock: seconds (tests pass their own).
    """

    def __init__(
        self,
        pb_utils: Any,
        model: str,
        version: str,
        steps: Sequence[str],
        flush_s: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        self._flush_s = flush_s
        self._sums = dict.fromkeys(steps, 0.0)
        self._executions = 0
        self._items = 0
        self._flushed_at = clock()
        self._metrics: dict[str, Any] | None = None
        # A model that answers from its own threads (image_classifier_gpu's overlapped way) times
        # steps in several threads: the sums and their hand-over must not lose an addition.
        self._lock = threading.Lock()
        try:
            labels = {"model": model, "version": version}
            counter = pb_utils.MetricFamily.COUNTER
            # The families must outlive their metrics (the stub refuses an increment otherwise).
            self._families = [
                pb_utils.MetricFamily(
                    name="python_model_step_seconds_total",
                    kind=counter,
                    description="Seconds a Python model's execute() spent in each of its steps",
                ),
                pb_utils.MetricFamily(
                    name="python_model_executions_total",
                    kind=counter,
                    description="Executions whose steps were timed",
                ),
                pb_utils.MetricFamily(
                    name="python_model_items_total",
                    kind=counter,
                    description="Items (images, rows) those executions carried",
                ),
            ]
            steps_family, executions, items = self._families
            self._metrics = {
                step: steps_family.Metric(labels={**labels, "step": step}) for step in steps
            }
            self._metrics["executions"] = executions.Metric(labels=labels)
            self._metrics["items"] = items.Metric(labels=labels)
        except Exception as exc:  # no custom metrics in this stub: time nothing
            log.warning(
                "step timing is off: this Triton's Python stub has no custom metrics (%s)", exc
            )
            self._metrics = None

    @property
    def enabled(self) -> bool:
        return self._metrics is not None

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Add the block's wall time to step ``name`` (an exception still counts the time spent)."""
        started = self._clock()
        try:
            yield
        finally:
            self.add(name, self._clock() - started)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to step ``name`` (a step timed elsewhere, e.g. in another thread)."""
        with self._lock:
            self._sums[name] += seconds

    def executed(self, items: int) -> None:
        """Count one finished execution of ``items`` items; hand the sums to Triton when due."""
        with self._lock:
            self._executions += 1
            self._items += items
            due = self._clock() - self._flushed_at >= self._flush_s
        if due:
            self.flush()

    def flush(self) -> None:
        """Hand everything summed since the last flush to Triton."""
        with self._lock:
            self._flushed_at = self._clock()
            if self._metrics is None:
                return
            pending = {
                **self._sums,
                "executions": float(self._executions),
                "items": float(self._items),
            }
            self._sums = dict.fromkeys(self._sums, 0.0)
            self._executions = self._items = 0
        for name, value in pending.items():
            if value > 0:
                self._metrics[name].increment(value)
