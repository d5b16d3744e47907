"""What the residency manager reports: its Prometheus metrics and Triton's memory as last read."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["MemoryReadings", "ResidencyMetrics"]

_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


class ResidencyMetrics:
    """Loads, evictions, cold-load time per model, and memory against the budget."""

    def __init__(self, registry: CollectorRegistry, budget_bytes: int) -> None:
        self.loads = Counter(
            "gateway_model_loads",
            "Model loads on demand, by outcome",
            ["model", "outcome"],
            registry=registry,
        )
        self.evictions = Counter(
            "gateway_model_evictions",
            "Models evicted, by reason",
            ["model", "reason"],
            registry=registry,
        )
        self.cold_load = Histogram(
            "gateway_model_cold_load_seconds",
            "Time to load a model on demand",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        self.charged = Gauge(
            "gateway_model_memory_charged_bytes",
            "What resident models are charged against the budget",
            registry=registry,
        )
        self.measured = Gauge(
            "gateway_model_memory_measured_bytes",
            "Triton's memory now, as the residency meter reads it",
            registry=registry,
        )
        self.budget = Gauge(
            "gateway_model_memory_budget_bytes", "The residency memory budget", registry=registry
        )
        self.budget.set(budget_bytes)


class MemoryReadings:
    """Triton's memory at the last reading, and a count of the events that may have changed it.

    A load whose readings before and after saw the same :attr:`epoch` had Triton's memory to
    itself, so the difference is its footprint alone.
    """

    def __init__(self, metrics: ResidencyMetrics) -> None:
        self._metrics = metrics
        #: bumped whenever Triton's memory may change (a load starts, a model is evicted)
        self.epoch = 0
        #: Triton's memory at the last reading (start, load or eviction)
        self.measured_bytes = 0

    def changing(self) -> int:
        """Note that Triton's memory is about to change; the new epoch."""
        self.epoch += 1
        return self.epoch

    def record(self, used_bytes: int) -> None:
        self.measured_bytes = used_bytes
        self._metrics.measured.set(used_bytes)
