"""Small ``Depends`` accessors for what the lifespan put on ``app.state``."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gateway.observe.stats import LatencyTracker
from gateway.tasks.service import InferenceService
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.context import CONTEXT_KEY, RequestContext
from gateway.tenancy.keys import KeyStore

__all__ = [
    "CLIENT_AUTH",
    "ADMIN_AUTH",
    "METRICS_AUTH",
    "get_authenticator",
    "get_context",
    "get_service",
    "get_store",
    "get_tracker",
]

# OpenAPI security requirements (``openapi_extra``). The auth middleware enforces credentials before
# any route runs, so no per-request security dependency is needed (each one costs time on the hot path).
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "An API key (gk_...) or a JWT"},
    "apiKey": {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "An API key (gk_...)",
    },
    "adminToken": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Admin-Token",
        "description": "GATEWAY_ADMIN_TOKEN",
    },
    "metricsToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "GATEWAY_METRICS_TOKEN (for /metrics; the admin token works too)",
    },
}
CLIENT_AUTH: dict[str, Any] = {"security": [{"bearer": []}, {"apiKey": []}]}
ADMIN_AUTH: dict[str, Any] = {"security": [{"adminToken": []}]}
METRICS_AUTH: dict[str, Any] = {"security": [{"metricsToken": []}, {"adminToken": []}]}


async def get_service(request: Request) -> InferenceService:
    return request.app.state.service  # type: ignore[no-any-return]


async def get_tracker(request: Request) -> LatencyTracker:
    return request.app.state.tracker  # type: ignore[no-any-return]


async def get_store(request: Request) -> KeyStore:
    return request.app.state.key_store  # type: ignore[no-any-return]


async def get_authenticator(request: Request) -> Authenticator:
    return request.app.state.authenticator  # type: ignore[no-any-return]


# Accessors are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool.


async def get_context(request: Request) -> RequestContext:
    ctx = request.scope.get(CONTEXT_KEY)
    if (
        ctx is None
    ):  # the context middleware is missing from the stack: a wiring bug, not a client error
        raise RuntimeError("request has no gateway context")
    return ctx  # type: ignore[no-any-return]
