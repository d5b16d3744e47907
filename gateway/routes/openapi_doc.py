"""The gateway's OpenAPI document: which credential each route takes, and exact integer bounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from gateway.jobs import protocol as job_protocol
from gateway.protocol import errors as error_protocol
from gateway.protocol import rest as protocol
from gateway.routes._deps import ADMIN_AUTH, CLIENT_AUTH, METRICS_AUTH, SECURITY_SCHEMES
from gateway.tenancy import key_protocol

__all__ = ["document_security"]


def document_security(
    app: FastAPI, public_paths: Sequence[str], metrics_paths: Sequence[str]
) -> None:
    """Declare in OpenAPI which credential each route takes (the auth middleware enforces it)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
            for path, operations in schema.get("paths", {}).items():
                if path in public_paths:
                    continue
                if path in metrics_paths:
                    requirement = METRICS_AUTH
                else:
                    requirement = ADMIN_AUTH if path.startswith("/admin/") else CLIENT_AUTH
                for operation in operations.values():
                    operation.update(requirement)
            _exact_integer_bounds(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _exact_integer_bounds(schema: dict[str, Any]) -> None:
    """Put back the integer bounds FastAPI's OpenAPI model turns into floats (2**63 - 1, the largest
    seed, would otherwise be documented as 2**63, one past it)."""
    components = schema.get("components", {}).get("schemas", {})
    for name, model in [
        item
        for module in (protocol, job_protocol, key_protocol, error_protocol)
        for item in vars(module).items()
    ]:
        if not (isinstance(model, type) and issubclass(model, BaseModel) and name in components):
            continue
        documented = components[name].get("properties", {})
        for field, spec in model.model_json_schema().get("properties", {}).items():
            for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(spec.get(bound), int) and field in documented:
                    documented[field][bound] = spec[bound]
