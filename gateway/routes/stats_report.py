"""The ``/v1/stats`` document, and what each credential may see of it.

- The admin credential sees everything: every model (all traffic), every client, every
  (model, client) pair, and Triton's split with its request counts.
- A client credential (API key or JWT) sees its own traffic only: its figures per model it called
  and in total, and Triton's mean queue/compute time for those models (no request counts: those
  would tell one tenant another's volume).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.observe.stats import LatencyTracker
from gateway.tenancy.context import Principal
from serving.quantiles import RELATIVE_ACCURACY, LatencySketch, summarize

__all__ = ["latency_summary", "stats_document"]


def latency_summary(sketch: LatencySketch) -> dict[str, float | int] | None:
    """Count, P50/P95/P99, mean and max in milliseconds, or ``None`` for no requests."""
    summary = summarize(sketch)
    if summary is None:
        return None
    ms = summary.scaled(1000.0)
    return {
        "count": ms.count,
        "p50_ms": round(ms.p50, 3),
        "p95_ms": round(ms.p95, 3),
        "p99_ms": round(ms.p99, 3),
        "mean_ms": round(ms.mean, 3),
        "max_ms": round(ms.max, 3),
    }


def _merged(sketches: Iterable[LatencySketch]) -> LatencySketch:
    total = LatencySketch()
    for sketch in sketches:
        total.merge(sketch)
    return total


async def stats_document(tracker: LatencyTracker, principal: Principal) -> dict[str, Any]:
    """The ``/v1/stats`` body for ``principal``.

    Args:
        tracker: the app's latency tracker (its view merges every process sharing the store).
        principal: the caller; ``kind == "admin"`` sees every tenant.

    Returns:
        The JSON-ready document.
    """
    is_admin = principal.kind == "admin"
    view = await tracker.view(None if is_admin else principal.client_id)
    by_model: dict[str, list[LatencySketch]] = {}
    by_client: dict[str, list[LatencySketch]] = {}
    pairs: dict[str, dict[str, Any]] = {}
    for (model, client), sketch in sorted(view.series.items()):
        by_model.setdefault(model, []).append(sketch)
        by_client.setdefault(client, []).append(sketch)
        if is_admin:
            pairs.setdefault(model, {})[client] = latency_summary(sketch)
    triton = tracker.triton_times()
    names = sorted(set(by_model) | set(triton)) if is_admin else sorted(by_model)
    models: dict[str, Any] = {}
    for name in names:
        times = triton.get(name)
        triton_part: dict[str, float | int] | None = times.as_dict() if times else None
        if triton_part is not None and not is_admin:
            triton_part.pop("requests")
        models[name] = {
            "gateway": latency_summary(_merged(by_model.get(name, []))),
            "triton": triton_part,
        }
    document: dict[str, Any] = {
        "scope": "all" if is_admin else principal.client_id,
        "window_s": tracker.window_s,
        "bucket_s": tracker.bucket_s,
        "relative_error": RELATIVE_ACCURACY,
        "complete": view.complete,
        "models": models,
        "clients": {client: latency_summary(_merged(s)) for client, s in sorted(by_client.items())},
    }
    if is_admin:
        document["model_clients"] = pairs
    return document
