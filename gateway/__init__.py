"""The inference gateway: FastAPI in front of Triton, with auth, rate limits and latency stats.

Public API (everything else is internal and may change):

- :func:`create_app` and :class:`GatewaySettings`: build the ASGI app from settings.
- :func:`serve`: run it under uvicorn (``python -m gateway`` does this).
- :class:`KeyStore`, :func:`open_key_store` and :func:`bootstrap_first_key`: manage API keys in the
  configured store, SQLite or Redis (the platform's start command uses the last to print a first key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "GatewaySettings",
    "KeyStore",
    "bootstrap_first_key",
    "create_app",
    "open_key_store",
    "serve",
]

_EXPORTS = {
    "GatewaySettings": "gateway.settings",
    "KeyStore": "gateway.tenancy.keys",
    "bootstrap_first_key": "gateway.tenancy.key_stores",
    "create_app": "gateway.app",
    "open_key_store": "gateway.tenancy.key_stores",
    "serve": "gateway.http.server",
}

if TYPE_CHECKING:
    from gateway.app import create_app
    from gateway.http.server import serve
    from gateway.settings import GatewaySettings
    from gateway.tenancy.key_stores import bootstrap_first_key, open_key_store
    from gateway.tenancy.keys import KeyStore


def __getattr__(name: str) -> Any:
    # Lazy: `import gateway` stays cheap (no FastAPI, no tritonclient) for the CLI and key tools.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
