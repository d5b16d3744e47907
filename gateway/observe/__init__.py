"""What the gateway measures: latency sketches and their shared stores, Prometheus metrics, the
per-stage timing of a request and the learned pace of image generations.

Each module is imported by its own name (``from gateway.observe.<module> import ...``); this
package re-exports nothing, so importing one room costs only what that module needs.
"""

from __future__ import annotations

__all__ = [
    "generation_pace",
    "latency",
    "redis_series",
    "stats",
    "stats_store",
    "timing",
]
