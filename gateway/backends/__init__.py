"""Triton behind the gateway: the HTTP and gRPC clients, readiness, the model catalog, the model
cards each served model reports, the per-model breakers and their healer, and model residency
(loading models on demand under a memory budget).
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = [
    "catalog",
    "http1_pool",
    "model_breaker",
    "model_cards",
    "model_healer",
    "readiness",
    "residency",
    "residency_memory",
    "residency_policy",
    "residency_settings",
    "residency_triton",
    "triton",
    "triton_errors",
    "triton_grpc",
    "triton_settings",
]
