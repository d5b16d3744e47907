"""Where a request's time goes in the gateway during one load point, from the gateway's own metrics.

The gateway times each admitted request's stages (:mod:`gateway.observe.timing`: ``auth``, ``admit``,
``parse``, ``upstream``) into ``gateway_stage_duration_seconds`` and the whole request into
``gateway_request_duration_seconds``; with several workers, one scrape of ``/metrics`` sums them
all. Two scrapes around a load point give each stage's mean per request over the point. Beside the
client's mean latency and Triton's own time (:mod:`loadtest.bench.triton_split`), they split what
a request spent outside Triton into:

==================  ==============================================================================
``before_app``      client's mean minus the gateway's total: the client, the connection, HTTP
                    parsing and the gateway event loop's backlog before the request's code ran
``auth`` ...        the gateway's stages
``to_triton``       ``upstream`` minus Triton's arrival-to-response time: the hop to Triton and back
                    (encoding the request, the connection pool, HTTP both ways, the event loop's
                    backlog on the answer)
``other``           the gateway's total minus its stages: routing, reading the body, FastAPI, the
                    answer's encoding
==================  ==============================================================================

Beside them, ``loop_lag``: how late the workers' event loops ran a timer, on average over the point
(``gateway_event_loop_lag_seconds``). Each await of a request waits about that long before it runs
again, so a backed-up loop shows here while the stages only show its effect.

Means, as with Triton's statistics, and beside them where the slowest requests spent their time, read
from the same histograms' buckets: ``total_p99`` and ``upstream_p99`` (the upper bound of the bucket
holding the 99th percentile of the gateway's whole request and of its upstream stage; the buckets are
25% apart) and ``loop_lag_max`` (the bucket bound of the longest lag sampled). A client P99 far above
``total_p99`` was lost before the gateway's code ran; an ``upstream_p99`` close to ``total_p99``, on
the way to Triton and in it. The scrapes include the point's warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from loadtest.bench.report import config_table
from loadtest.bench.triton_split import OUTSIDE_COLUMNS, outside_cells

__all__ = [
    "GatewaySplit",
    "bucket_bound_ms",
    "gateway_counters",
    "gateway_split",
    "gateway_table",
]

STAGES = ("auth", "admit", "parse", "upstream")
#: the histograms whose buckets are kept too (see the module docstring)
TAIL_NAMES = ("total", "upstream", "loop_lag")


def gateway_counters(base_url: str, token: str) -> dict[str, float]:
    """The gateway's cumulative stage and request sums (seconds) and counts, all models together;
    its collector pauses as ``gc0`` to ``gc2`` (one per generation)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = (
        httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        .raise_for_status()
        .text
    )
    families = {
        "gateway_stage_duration_seconds": "",
        "gateway_request_duration_seconds": "total",
        "gateway_event_loop_lag_seconds": "loop_lag",
        "gateway_gc_pause_seconds": "gc",
    }
    names = (*STAGES, "total", "loop_lag", "gc0", "gc1", "gc2")
    counters: dict[str, float] = {f"{name}_{kind}": 0.0 for name in names for kind in ("s", "n")}
    for family in text_string_to_metric_families(text):
        if family.name not in families:
            continue
        for sample in family.samples:
            suffix = sample.name.removeprefix(family.name)
            name = sample.labels.get("stage", families[family.name])
            name += sample.labels.get("generation", "")
            if suffix == "_bucket" and name in TAIL_NAMES:  # cumulative: summed over labels too
                key = f"{name}_le_{sample.labels['le']}"
                counters[key] = counters.get(key, 0.0) + sample.value
                continue
            kind = {"_sum": "s", "_count": "n"}.get(suffix)
            if kind is not None and f"{name}_{kind}" in counters:
                counters[f"{name}_{kind}"] += sample.value
    return counters


@dataclass(frozen=True)
class GatewaySplit:
    """The gateway's requests between two scrapes: how many, and each stage's mean per request (ms)."""

    requests: int
    total_ms: float
    auth_ms: float
    admit_ms: float
    parse_ms: float
    upstream_ms: float
    loop_lag_ms: float
    #: bucket bounds (ms) of the slowest requests and the longest lag (see the module docstring)
    total_p99_ms: float = 0.0
    upstream_p99_ms: float = 0.0
    loop_lag_max_ms: float = 0.0

    @property
    def other_ms(self) -> float:
        return self.total_ms - self.auth_ms - self.admit_ms - self.parse_ms - self.upstream_ms

    def as_dict(self, client_mean_ms: float, in_triton_ms: float) -> dict[str, Any]:
        """The split, with what lies before the gateway's code and on the hop to Triton."""
        figures: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        figures.update(
            other_ms=self.other_ms,
            before_app_ms=client_mean_ms - self.total_ms,
            to_triton_ms=self.upstream_ms - in_triton_ms,
        )
        return figures


def gateway_split(before: dict[str, float], after: dict[str, float]) -> GatewaySplit:
    """The means of the requests the gateway answered between the two scrapes."""
    delta = {k: after[k] - before.get(k, 0.0) for k in after}

    def mean_ms(name: str) -> float:
        count = delta[f"{name}_n"]
        return delta[f"{name}_s"] / count * 1000 if count else 0.0

    return GatewaySplit(
        requests=int(delta["total_n"]),
        total_ms=mean_ms("total"),
        auth_ms=mean_ms("auth"),
        admit_ms=mean_ms("admit"),
        parse_ms=mean_ms("parse"),
        upstream_ms=mean_ms("upstream"),
        loop_lag_ms=mean_ms("loop_lag"),
        total_p99_ms=bucket_bound_ms(delta, "total", 0.99),
        upstream_p99_ms=bucket_bound_ms(delta, "upstream", 0.99),
        loop_lag_max_ms=bucket_bound_ms(delta, "loop_lag", 1.0),
    )


def bucket_bound_ms(delta: dict[str, float], name: str, q: float) -> float:
    """The upper bound (ms) of the histogram bucket that holds the ``q`` quantile of ``name``'s
    observations between two scrapes (as Prometheus's ``histogram_quantile`` finds the bucket; no
    interpolation inside it); 0 without observations."""
    buckets = sorted(
        (float(key.rpartition("_le_")[2]), count)
        for key, count in delta.items()
        if key.startswith(f"{name}_le_")
    )
    total = buckets[-1][1] if buckets else 0.0  # the +Inf bucket counts every observation
    if total <= 0:
        return 0.0
    for bound, count in buckets:
        if count >= q * total:
            return bound * 1000
    return math.inf


def gateway_table(rows: list[dict[str, Any]]) -> Any:
    """A rich table of gateway points: each row has ``config``, ``concurrency``, ``client_mean_ms``,
    ``outside_triton_ms`` and ``gateway`` (:meth:`GatewaySplit.as_dict`); rows without ``gateway``
    are skipped."""
    columns = (
        "before_app",
        "auth",
        "admit",
        "parse",
        "to_triton",
        "other",
        "loop_lag",
        "total_p99",
        "upstream_p99",
        "loop_lag_max",
    )
    table = config_table(
        (*OUTSIDE_COLUMNS, *(c.replace("_", " ") for c in columns)),
        title="Where the gateway's time goes (means per request, ms; the last three: bucket bounds "
        "of the slowest; the gateway's stage metrics, see loadtest.bench.gateway_split)",
    )
    for row in rows:
        if "gateway" in row:
            stages = row["gateway"]
            cells = (stages.get(f"{c}_ms") for c in columns)  # rows of older runs lack the bounds
            table.add_row(*outside_cells(row), *("-" if v is None else f"{v:.2f}" for v in cells))
    return table
