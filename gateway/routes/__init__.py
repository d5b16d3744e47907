"""HTTP routers, one module per API: health, KServe v2 (REST and gRPC), OpenAI-style, classify,
stats, jobs, usage, admin (keys, traffic, residency); and the finishing of the OpenAPI document.

Each module is imported by its own name; this package re-exports nothing.
"""

from __future__ import annotations

__all__ = [
    "admin",
    "classify",
    "health",
    "jobs",
    "kserve",
    "kserve_grpc",
    "openai",
    "openapi_doc",
    "residency_admin",
    "stats",
    "stats_report",
    "traffic",
    "usage",
]
