"""Where a request's time goes inside Triton during one load point, from Triton's statistics.

Triton counts, per model, cumulative nanoseconds of each stage of the requests it answered
(statistics extension, ``GET /v2/models/<name>/stats``): ``queue`` (waiting for the dynamic batcher
and a free instance), ``compute_input`` / ``compute_infer`` / ``compute_output`` (for a Python
model: handing the inputs to its stub process, the stub's ``execute()`` with that IPC, and taking
the outputs back) and ``success`` (arrival to response, all of it). Two snapshots around a load
point give the mean per request of each stage over that point; the client's mean latency minus
``success`` is what the request spent outside Triton (the client, HTTP, and a gateway where one is
in the path). Means, not percentiles: Triton keeps no per-request record.

A Python model that times its own steps (``serving/step_metrics.py``, the GPU image pipeline does)
splits ``compute_infer`` further: given Triton's metrics URL, the snapshots also read its
``python_model_step_seconds_total`` counters, and the split gives each step's mean per execution.
The stub hands those over about once a second, so they cover slightly fewer executions than the
statistics; each mean is over the executions the same counters saw.

The snapshots include the point's warm-up, at the same load as its measured seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.triton_clients import triton_client

__all__ = ["OUTSIDE_COLUMNS", "TritonSplit", "model_counters", "outside_cells", "split"]

_STAGES = ("queue", "compute_input", "compute_infer", "compute_output", "success")

#: the leading columns of every table of split points (Triton's stages, the gateway's), as
#: :func:`outside_cells` fills them
OUTSIDE_COLUMNS = ("config", "concurrency", "client", "outside Triton")


def outside_cells(row: Mapping[str, Any]) -> list[str]:
    """A split point's (:meth:`TritonSplit.as_dict` with the client's mean) configuration and
    concurrency, the client's mean and what of it lay outside Triton (ms)."""
    return [
        row["config"],
        str(row["concurrency"]),
        f"{row['client_mean_ms']:.2f}",
        f"{row['outside_triton_ms']:.2f}",
    ]


def model_counters(url: str, model: str, metrics_url: str | None = None) -> dict[str, float]:
    """``model``'s cumulative counters (all versions summed): requests, executions, inferences and
    the nanoseconds of each stage; with ``metrics_url``, also its steps' seconds (``step:<name>``)
    and the executions they cover (``step_executions``), where the model reports them."""

    with triton_client(url) as client:
        versions = client.get_inference_statistics(model)["model_stats"]
    counters: dict[str, float] = {
        "requests": 0,
        "executions": 0,
        "inferences": 0,
        **{f"{s}_ns": 0 for s in _STAGES},
    }
    for stats in versions:
        counters["executions"] += int(stats.get("execution_count", 0))
        counters["inferences"] += int(stats.get("inference_count", 0))
        inference: dict[str, Any] = stats.get("inference_stats", {})
        counters["requests"] += int(inference.get("success", {}).get("count", 0))
        for stage in _STAGES:
            counters[f"{stage}_ns"] += int(inference.get(stage, {}).get("ns", 0))
    if metrics_url:
        counters.update(_step_counters(metrics_url, model))
    return counters


def _step_counters(metrics_url: str, model: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(
        httpx.get(metrics_url, timeout=30).raise_for_status().text
    ):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == "python_model_step_seconds_total":
                key = f"step:{sample.labels['step']}"
            elif sample.name == "python_model_executions_total":
                key = "step_executions"
            else:
                continue
            counters[key] = counters.get(key, 0.0) + sample.value
    return counters


@dataclass(frozen=True)
class TritonSplit:
    """One model's statistics between two snapshots: counts, and each stage's mean per request (ms)."""

    model: str
    requests: int
    executions: int
    inferences: int
    queue_ms: float
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float
    in_triton_ms: float
    #: the model's own steps, mean ms per execution (empty where it reports none)
    steps_ms: dict[str, float] = field(default_factory=dict)

    @property
    def inferences_per_execution(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    def outside_ms(self, client_mean_ms: float) -> float:
        """What the client waited beyond Triton's own arrival-to-response time."""
        return client_mean_ms - self.in_triton_ms

    def as_dict(self, client_mean_ms: float | None = None) -> dict[str, Any]:
        figures: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        figures["inferences_per_execution"] = self.inferences_per_execution
        if client_mean_ms is not None:
            figures["client_mean_ms"] = client_mean_ms
            figures["outside_triton_ms"] = self.outside_ms(client_mean_ms)
        return figures


def split(model: str, before: dict[str, float], after: dict[str, float]) -> TritonSplit:
    """The statistics of the requests ``model`` answered between the two snapshots."""
    delta = {k: after[k] - before.get(k, 0) for k in after}
    per = max(delta["requests"], 1)
    executions = delta.get("step_executions", 0)
    steps = (
        {
            k.removeprefix("step:"): v / executions * 1e3
            for k, v in delta.items()
            if k.startswith("step:")
        }
        if executions
        else {}
    )

    def mean_ms(stage: str) -> float:
        return delta[f"{stage}_ns"] / per / 1e6

    return TritonSplit(
        model=model,
        requests=int(delta["requests"]),
        executions=int(delta["executions"]),
        inferences=int(delta["inferences"]),
        queue_ms=mean_ms("queue"),
        compute_input_ms=mean_ms("compute_input"),
        compute_infer_ms=mean_ms("compute_infer"),
        compute_output_ms=mean_ms("compute_output"),
        in_triton_ms=mean_ms("success"),
        steps_ms=steps,
    )
