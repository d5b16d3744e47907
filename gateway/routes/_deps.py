"""Small ``Depends`` accessors for what the lifespan put on ``app.state``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request

from gateway.tenancy.context import CONTEXT_KEY, RequestContext

__all__ = [
    "CLIENT_AUTH",
    "ADMIN_AUTH",
    "METRICS_AUTH",
    "app_state",
    "get_authenticator",
    "get_context",
    "get_image_urls",
    "get_jobs",
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


def app_state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A ``Depends`` accessor for ``app.state.<name>``, what the lifespan put there."""

    # ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool.
    async def read(request: Request) -> Any:
        return getattr(request.app.state, name)

    return read


get_service = app_state("service")
get_tracker = app_state("tracker")
get_store = app_state("key_store")
get_authenticator = app_state("authenticator")


async def get_context(request: Request) -> RequestContext:
    ctx = request.scope.get(CONTEXT_KEY)
    if (
        ctx is None
    ):  # the context middleware is missing from the stack: a wiring bug, not a client error
        raise RuntimeError("request has no gateway context")
    return ctx  # type: ignore[no-any-return]


# what the job routes and the OpenAI image route both use
get_jobs = app_state("jobs")
get_image_urls = app_state("image_urls")
