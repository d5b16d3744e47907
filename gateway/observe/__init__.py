"""What the gateway measures: latency sketches and their shared stores, Prometheus metrics, the
per-stage timing of a request, the garbage collector's pauses and the learned pace of image
generations.
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = [
    "gc_pauses",
    "generation_pace",
    "latency",
    "metrics",
    "redis_series",
    "settings",
    "stats",
    "stats_store",
    "store_calls",
    "timing",
]
