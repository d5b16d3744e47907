"""HTTP routers, one module per API: health, KServe v2 (REST, its inference lane, and gRPC),
OpenAI-style, classify, stats, jobs, usage, admin (keys, traffic, residency); and the finishing of
the OpenAPI document.
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = [
    "admin",
    "classify",
    "health",
    "jobs",
    "kserve",
    "kserve_grpc",
    "kserve_lane",
    "openai",
    "openapi_doc",
    "residency_admin",
    "stats",
    "stats_report",
    "traffic",
    "usage",
]
