"""Per-key body bytes in flight: Stripe's concurrent-requests limiter, counted in bytes.

A tier's ``max_inflight_bytes`` (:class:`gateway.tenancy.tiers.TierLimit`) bounds the sum of the
body bytes one key has in flight at once: bodies still being received plus requests being served.
Bytes are taken as the body arrives (a declared ``Content-Length`` is taken whole before a byte is
read), before any parse, and given back when the request ends, however it ends. Many small requests
cost little, so the requests-in-flight bound (``max_concurrent``) alone would let one key hold the
serving process with a few big bodies; this bound is what their parse and their memory cost.

The ledger lives in one gateway process: with several workers or replicas each enforces the bound
on the requests it serves (a key may hold up to the bound in each). A shared counter would have to
be given back by a process that died holding it, which a per-process one never needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import Overloaded, PayloadTooLarge

__all__ = ["BodyClaim", "InFlightBytes"]


class InFlightBytes:
    """The body bytes each key holds in this process (an entry exists only while it is above 0)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def held(self, client_id: str) -> int:
        """Body bytes ``client_id`` holds now."""
        return self._held.get(client_id, 0)

    def total(self) -> int:
        """Body bytes every key together holds now."""
        return sum(self._held.values())

    def claim(self, client_id: str, tier: str, bound: int, retry_after_s: float) -> BodyClaim:
        """An empty claim of one request of ``client_id`` on its tier's ``bound``."""
        return BodyClaim(self, client_id, tier, bound, retry_after_s)

    def _take(self, client_id: str, n: int, bound: int) -> bool:
        held = self._held.get(client_id, 0)
        if held + n > bound:
            return False
        self._held[client_id] = held + n
        return True

    def _give_back(self, client_id: str, n: int) -> None:
        left = self._held.get(client_id, 0) - n
        if left > 0:
            self._held[client_id] = left
        else:
            self._held.pop(client_id, None)


@dataclass
class BodyClaim:
    """The bytes one request holds on its key's bound.

    Attributes:
        ledger: the process's ledger.
        client_id: the key.
        tier: the key's tier (named in refusals).
        bound: the tier's ``max_inflight_bytes``.
        retry_after_s: the ``Retry-After`` of a refusal.
        taken: bytes held now.
    """

    ledger: InFlightBytes
    client_id: str
    tier: str
    bound: int
    retry_after_s: float
    taken: int = 0

    def cover(self, total: int) -> None:
        """Hold ``total`` body bytes for this request (what it already holds counts).

        Args:
            total: the body bytes this request has (or has declared) so far.

        Raises:
            PayloadTooLarge: this body alone is larger than the bound (it could never be served).
            Overloaded: the key's other requests hold too much of the bound to fit it now.
        """
        if total <= self.taken:
            return
        if total > self.bound:
            raise PayloadTooLarge(
                f"request body of {total} bytes is larger than the body bytes a key may have in "
                f"flight (tier '{self.tier}': {self.bound} bytes)",
                field="body",
            )
        if not self.ledger._take(self.client_id, total - self.taken, self.bound):
            held = self.ledger.held(self.client_id)
            raise Overloaded(
                f"this key already has {held} body bytes in flight; tier '{self.tier}' allows "
                f"{self.bound} at once, so this body of {total} bytes does not fit; retry when one "
                "has been answered",
                retry_after_s=self.retry_after_s,
            )
        self.taken = total

    def release(self) -> None:
        """Give back what this request holds (again: nothing)."""
        if self.taken:
            self.ledger._give_back(self.client_id, self.taken)
            self.taken = 0
