"""The wire: the uvicorn server, plain ASGI middleware, connection and body limits, compressed
bodies, and problem+json rendering of errors.

The first room a request passes: :mod:`gateway.http.limits` (uvicorn's protocol, bound to
:mod:`gateway.http.server_limits`; its accept rate per address is :mod:`gateway.http.accept_rate`), then the
middleware of :mod:`gateway.http.middleware`, :mod:`gateway.http.body_bytes` (a key's body bytes in
flight) and :mod:`gateway.http.compression`. Several worker processes each listen on a socket of
their own (:mod:`gateway.http.workers`).
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = [
    "accept_rate",
    "body_bytes",
    "compression",
    "connection_settings",
    "limits",
    "middleware",
    "problems",
    "server",
    "server_limits",
    "validation_report",
    "workers",
]
