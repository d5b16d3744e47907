"""Settings of the wire (connection limits, request bodies and their parsing), part of
:class:`gateway.settings.GatewaySettings`.

Each field is the environment variable ``GATEWAY_<FIELD>``; :class:`gateway.http.server_limits.ServerLimits`
reads the per-connection ones, the body limit middleware and the parse pool the rest.
"""

from __future__ import annotations

from pydantic import Field

from gateway.env_settings import EnvSettings, count, seconds

__all__ = [
    "DEFAULT_ACCEPT_BURST",
    "DEFAULT_ACCEPT_RATE_PER_S",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_KEEP_ALIVE_TIMEOUT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_PEER",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_MAX_HEADER_COUNT",
    "DEFAULT_MAX_REQUESTS_PER_CONNECTION",
    "DEFAULT_PARSE_PROCESS_MIN_BYTES",
    "DEFAULT_PARSE_WORKERS",
    "ConnectionSettings",
]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: worker processes per gateway process that parse big KServe v2 REST bodies
#: (gateway.protocol.kserve.ParsePool)
DEFAULT_PARSE_WORKERS = 2
#: the smallest parse (RestBody.work_bytes) sent to a worker process: ~2.5 ms of JSON on 2 cores
DEFAULT_PARSE_PROCESS_MIN_BYTES = 64 * 1024
# Connection limits (gateway/http/limits.py). 32 KiB of headers holds a large JWT many times over.
DEFAULT_MAX_HEADER_BYTES = 32 * 1024
DEFAULT_MAX_HEADER_COUNT = 100
DEFAULT_HEADER_TIMEOUT_S = 10.0
# A 16 MiB body at 4 Mbit/s takes about 35 s.
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 1024
# One address: a client, or a proxy in front of the gateway (raise it to max_connections there).
DEFAULT_MAX_CONNECTIONS_PER_PEER = 256
# New connections per second from one address, and how many may come back to back
# (gateway/http/accept_rate.py).
DEFAULT_ACCEPT_RATE_PER_S = 200.0
DEFAULT_ACCEPT_BURST = 400
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
DEFAULT_MAX_REQUESTS_PER_CONNECTION = 10_000


class ConnectionSettings(EnvSettings):
    """The connection limits, ``max_body_bytes`` and the ``parse_*`` fields."""

    max_body_bytes: int = count(DEFAULT_MAX_BODY_BYTES)
    parse_workers: int = count(
        DEFAULT_PARSE_WORKERS,
        "processes that parse big KServe v2 REST bodies and decode big OpenAI JSON bodies off the "
        "serving process; 0: a thread (KServe) or the loop (OpenAI)",
        least=0,
        most=64,
    )
    parse_process_min_bytes: int = count(
        DEFAULT_PARSE_PROCESS_MIN_BYTES,
        "bodies whose parse weighs at least this many bytes of JSON go to a parse process",
        least=0,
    )
    max_header_bytes: int = Field(
        DEFAULT_MAX_HEADER_BYTES, ge=1024, description="request line plus headers"
    )
    max_header_count: int = count(DEFAULT_MAX_HEADER_COUNT)
    header_timeout_s: float = seconds(
        DEFAULT_HEADER_TIMEOUT_S, "from a request's first byte to the end of its headers"
    )
    body_timeout_s: float = seconds(
        DEFAULT_BODY_TIMEOUT_S, "from the end of the headers to the last byte of the body"
    )
    max_connections: int = count(
        DEFAULT_MAX_CONNECTIONS, "open connections; past it an idle one is closed, else 429"
    )
    max_connections_per_peer: int = count(
        DEFAULT_MAX_CONNECTIONS_PER_PEER,
        "open connections from one peer address; past it its longest idle one is closed, else 429",
    )
    accept_rate_per_s: float = Field(
        DEFAULT_ACCEPT_RATE_PER_S,
        ge=0,
        allow_inf_nan=False,
        description="new connections per second from one peer address (0: no limit); past it and the "
        "burst a canned 429 before any parsing",
    )
    accept_burst: int = count(
        DEFAULT_ACCEPT_BURST, "new connections one peer address may open back to back"
    )
    hold_ignored_retry_after_s: float = Field(
        10.0,
        ge=0,
        allow_inf_nan=False,
        description="when a key sends before the Retry-After of its last 429 has passed, its "
        "connection is not read for the rest of that wait, at most this long; a connection refused at "
        "accept is answered when its address may connect again, at most this long after (0: never, "
        "and refused connections cost no token)",
    )
    keep_alive_timeout_s: float = seconds(DEFAULT_KEEP_ALIVE_TIMEOUT_S)
    max_requests_per_connection: int = count(DEFAULT_MAX_REQUESTS_PER_CONNECTION)
