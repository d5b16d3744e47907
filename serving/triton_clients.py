"""The one Triton client factory: every ``tritonclient`` ``InferenceServerClient`` the benchmarks,
the load generator and promotion open is made here.

The client modules are imported on first use (``tritonclient.grpc`` pulls in gRPC), and the
options are tritonclient's own, passed as they are, so each caller's timeouts and connection limits
stay what it asks for.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PROTOCOLS", "triton_client"]

#: protocol -> the tritonclient module whose InferenceServerClient speaks it
PROTOCOLS = {
    "http": "tritonclient.http",
    "grpc": "tritonclient.grpc",
    "http.aio": "tritonclient.http.aio",
    "grpc.aio": "tritonclient.grpc.aio",
}


def triton_client(url: str, protocol: str = "http", **options: Any) -> Any:
    """A tritonclient ``InferenceServerClient`` for ``url``.

    Args:
        url: ``host:port`` of Triton's HTTP or gRPC endpoint.
        protocol: ``http``, ``grpc``, ``http.aio`` or ``grpc.aio``.
        options: keyword options of that client (``network_timeout``, ``connection_timeout``,
            ``concurrency``, ``conn_limit``, ``conn_timeout``, ...), unchanged.

    Returns:
        The client; close it (or use it as a context manager) when done.

    Raises:
        ValueError: an unknown protocol.
    """
    module = PROTOCOLS.get(protocol)
    if module is None:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {protocol!r}")
    return importlib.import_module(module).InferenceServerClient(url, **options)
