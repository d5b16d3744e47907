"""The limits the gateway's HTTP server enforces per connection and per peer address, as one value.

:class:`ServerLimits` is read from :class:`gateway.settings.GatewaySettings` (fields of the same
names) and bound to uvicorn's protocol by :mod:`gateway.http.limits`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gateway.settings import GatewaySettings

__all__ = ["ServerLimits"]


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """Per-connection and per-peer limits (the ``GatewaySettings`` fields of the same names).

    Args:
        max_header_bytes: bytes of a request line plus headers.
        max_header_count: header fields per request.
        header_timeout_s: seconds from a request's first byte (or the connection's start) to the
            end of its headers.
        body_timeout_s: seconds from the end of the headers to the last byte of the body.
        max_connections: open connections; past it an idle one is closed, or the new one is
            answered 429 with Retry-After.
        max_connections_per_peer: open connections from one peer address; the same past it.
        keep_alive_timeout_s: seconds an idle keep-alive connection stays open.
        max_requests_per_connection: requests served on one connection before it is closed.
        accept_rate_per_s: new connections per second from one peer address (0: no limit); past
            it and the burst a new connection gets a canned 429 before any parsing.
        accept_burst: new connections one peer address may open back to back.
        hold_ignored_retry_after_s: the longest a client that comes back before its Retry-After
            has passed is kept waiting (a refused connection unanswered; a held connection unread).
    """

    max_header_bytes: int
    max_header_count: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_peer: int
    keep_alive_timeout_s: float
    max_requests_per_connection: int
    accept_rate_per_s: float
    accept_burst: int
    hold_ignored_retry_after_s: float

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ServerLimits:
        # Every field is the settings field of the same name: one place per limit.
        return cls(**{field.name: getattr(settings, field.name) for field in fields(cls)})
