"""The wire: the uvicorn server, plain ASGI middleware, connection and body limits, compressed
bodies, and problem+json rendering of errors.

The first room a request passes: :mod:`gateway.http.limits` (uvicorn's protocol), then the
middleware of :mod:`gateway.http.middleware` and :mod:`gateway.http.compression`.

Each module is imported by its own name (``from gateway.http.<module> import ...``); this
package re-exports nothing, so importing one room costs only what that module needs.
"""

from __future__ import annotations

__all__ = [
    "compression",
    "limits",
    "middleware",
    "problems",
    "server",
    "validation_report",
]
