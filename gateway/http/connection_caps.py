"""Connection caps per peer address and in total, where pressure closes idle connections first.

A client that opens many connections and sends nothing on them (or keeps idle keep-alive ones)
must not fill the gateway's connection table so that every other client is refused. So a new
connection over a cap first closes an *idle* connection (no request in progress, no byte of the
next one received) and is then served; only when no connection is idle is the new one refused (429
with Retry-After, :mod:`gateway.http_limits`):

- over ``max_connections_per_peer`` (connections from one peer address): the idle connection of
  that same peer that has been idle the longest, so a peer's pressure falls on its own connections;
- over ``max_connections`` (all connections of the process): an idle connection of the peer that
  holds the most connections, the longest idle of that peer first.

:class:`PeerCounts` keeps how many connections each peer address holds (entries leave at zero, so
the table is bounded by the connections open); :func:`idle_victim` picks the connection to close.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

__all__ = ["IdleAware", "PeerCounts", "idle_victim"]


class IdleAware(Protocol):
    """A connection as the caps see it."""

    @property
    def peer(self) -> str: ...

    def idle_since(self) -> float | None:
        """When the connection last became idle (loop time), or None while it is not idle."""
        ...


C = TypeVar("C", bound=IdleAware)


class PeerCounts:
    """Open connections per peer address (one table per server: its protocol class holds it)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def add(self, peer: str) -> int:
        """Count a new connection of ``peer``; returns how many ``peer`` now holds."""
        count = self._counts.get(peer, 0) + 1
        self._counts[peer] = count
        return count

    def remove(self, peer: str) -> None:
        count = self._counts.get(peer, 0) - 1
        if count > 0:
            self._counts[peer] = count
        else:
            self._counts.pop(peer, None)

    def __getitem__(self, peer: str) -> int:
        return self._counts.get(peer, 0)

    def __len__(self) -> int:
        return len(self._counts)


def idle_victim(
    connections: Iterable[C], counts: PeerCounts, *, peer: str | None = None, exclude: object = None
) -> C | None:
    """The idle connection to close to make room, or None when none is idle.

    Args:
        connections: the open connections.
        counts: connections per peer.
        peer: only this peer's connections (the per-peer cap); None: any peer's, the peer holding
            the most connections first (the total cap).
        exclude: a connection never chosen (the new one).

    Returns:
        The longest idle connection among those considered.
    """
    best: C | None = None
    best_key: tuple[int, float] | None = None
    for connection in connections:
        if connection is exclude or (peer is not None and connection.peer != peer):
            continue
        since = connection.idle_since()
        if since is None:
            continue
        key = (-counts[connection.peer], since)
        if best_key is None or key < best_key:
            best, best_key = connection, key
    return best
