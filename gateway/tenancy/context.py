"""Per-request state shared by the middleware and the service layer (no web framework here).

The context middleware puts one :class:`RequestContext` in the ASGI scope; authentication fills in
``principal``, the service fills in ``model`` and ``rate`` once the request is admitted, each stage
adds its time to ``stages``, and the context middleware reads them back to set the RateLimit and
Server-Timing headers and record the latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.observe.timing import StageTimes
from gateway.tenancy.ratelimit import Decision
from gateway.tenancy.usage import RequestUsage

__all__ = ["CONTEXT_KEY", "Principal", "RequestContext"]

CONTEXT_KEY = "gateway.context"


@dataclass(frozen=True)
class Principal:
    """Who is calling.

    Attributes:
        client_id: public id for logs, limits and metrics (``key:<key_id>`` or ``jwt:<sub>``).
        scopes: model names the caller may use, ``"*"`` for all.
        tier: rate-limit tier.
        kind: ``api_key``, ``jwt`` or ``admin``.
    """

    client_id: str
    scopes: frozenset[str]
    tier: str
    kind: str

    def allows(self, model: str) -> bool:
        return "*" in self.scopes or model in self.scopes


@dataclass
class RequestContext:
    """Mutable per-request facts; created by the context middleware."""

    request_id: str
    started: float = field(default_factory=time.perf_counter)
    principal: Principal | None = None
    model: str | None = None
    rate: Decision | None = None
    admitted: bool = False
    #: the request took a rate-limit token (a refused request that took none is charged afterwards)
    charged: bool = False
    usage: RequestUsage = field(default_factory=RequestUsage)
    stages: StageTimes = field(default_factory=StageTimes)
