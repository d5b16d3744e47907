"""Small ``Depends`` accessors for what the lifespan put on ``app.state``."""

from __future__ import annotations

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer

from gateway.auth import Authenticator
from gateway.context import CONTEXT_KEY, RequestContext
from gateway.keys import KeyStore
from gateway.service import InferenceService
from gateway.stats import LatencyTracker

__all__ = [
    "CLIENT_AUTH",
    "ADMIN_AUTH",
    "get_authenticator",
    "get_context",
    "get_service",
    "get_store",
    "get_tracker",
]

# Documentation only: the auth middleware enforces credentials before the route runs.
_bearer = HTTPBearer(auto_error=False, description="An API key (gk_...) or a JWT")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="An API key (gk_...)")
_admin = APIKeyHeader(name="X-Admin-Token", auto_error=False, description="GATEWAY_ADMIN_TOKEN")
CLIENT_AUTH = [Security(_bearer), Security(_api_key)]
ADMIN_AUTH = [Security(_admin)]


def get_service(request: Request) -> InferenceService:
    return request.app.state.service  # type: ignore[no-any-return]


def get_tracker(request: Request) -> LatencyTracker:
    return request.app.state.tracker  # type: ignore[no-any-return]


def get_store(request: Request) -> KeyStore:
    return request.app.state.key_store  # type: ignore[no-any-return]


def get_authenticator(request: Request) -> Authenticator:
    return request.app.state.authenticator  # type: ignore[no-any-return]


def get_context(request: Request) -> RequestContext:
    ctx = request.scope.get(CONTEXT_KEY)
    if ctx is None:  # the context middleware is missing from the stack: a wiring bug, not a client error
        raise RuntimeError("request has no gateway context")
    return ctx  # type: ignore[no-any-return]
