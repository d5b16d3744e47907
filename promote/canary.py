"""The canary's verdict: what the gateway routed to production and to N+1 while the canary ran.

:class:`CanaryWatch` counts the routed requests' outcomes from when it is made and, once the
canary's duration and minimum of requests are reached, compares the canary's error rate with
production's in the same window (:meth:`CanaryWatch.wait`). :mod:`promote.rollout` runs it.
"""

from __future__ import annotations

import time

from promote.evaluation import Outcome
from promote.gates import PromotionPolicy
from promote.gateway_traffic import GatewayTraffic

__all__ = ["CanaryVerdict", "CanaryWatch"]

#: how often the watch reads the gateway's counts
_POLL_S = 0.2


#: whether the canary passed, why not, and the counts it was judged on: an evaluation's outcome, as
#: the smoke test's is (the rollout records both the same way)
CanaryVerdict = Outcome


class CanaryWatch:
    """What the gateway routed to production and to the canary, per model, from when the watch was made.

    The gateway counts each routed request's outcome (see ``gateway.tenancy.traffic``); Triton's own
    statistics cannot serve here, since its Python-based backends report a request they answered
    with an error as a success.
    """

    def __init__(self, gateway: GatewayTraffic, routes: dict[str, tuple[str, str]]) -> None:
        self.gateway = gateway
        self.routes = routes  # model -> (production target, canary target)
        self.start = self._counts()
        self.started_at = time.monotonic()

    def _counts(self) -> dict[str, tuple[int, int]]:
        """``production`` and ``canary``: (answered, failed), summed over the models."""
        totals = {"production": [0, 0], "canary": [0, 0]}
        for model, targets in self.routes.items():
            outcomes = self.gateway.outcomes(model)
            for side, target in zip(("production", "canary"), targets, strict=True):
                answered, failed = outcomes.get(target, (0, 0))
                totals[side][0] += answered
                totals[side][1] += failed
        return {side: (a, f) for side, (a, f) in totals.items()}

    def _since(self) -> dict[str, tuple[int, int]]:
        now = self._counts()
        return {
            side: (now[side][0] - self.start[side][0], now[side][1] - self.start[side][1])
            for side in now
        }

    def wait(self, policy: PromotionPolicy) -> CanaryVerdict:
        """Wait for the canary's duration and its minimum of requests (at most ``canary_timeout_s``),
        then compare the canary's error rate with production's in the same window."""
        while True:
            elapsed = time.monotonic() - self.started_at
            since = self._since()
            total = sum(since["canary"])
            if elapsed >= policy.canary_timeout_s or (
                elapsed >= policy.canary_duration_s and total >= policy.min_canary_requests
            ):
                break
            time.sleep(_POLL_S)
        failed, (prod_answered, prod_failed) = since["canary"][1], since["production"]
        prod_total = prod_answered + prod_failed
        rate = failed / total if total else 0.0
        prod_rate = prod_failed / prod_total if prod_total else 0.0
        figures = {
            "seconds": round(elapsed, 2),
            "canary_requests": total,
            "canary_failed": failed,
            "canary_error_rate": rate,
            "production_requests": prod_total,
            "production_failed": prod_failed,
            "production_error_rate": prod_rate,
        }
        if total < policy.min_canary_requests:
            return CanaryVerdict(
                False,
                f"the canary saw {total} requests in {elapsed:.0f} s; it needs "
                f"{policy.min_canary_requests}",
                figures,
            )
        if rate > prod_rate + policy.max_canary_error_rate:
            return CanaryVerdict(
                False,
                f"{failed} of {total} canary requests failed (error rate {rate:.3f}; production "
                f"{prod_rate:.3f}, allowed {policy.max_canary_error_rate:.3f} more)",
                figures,
            )
        return CanaryVerdict(True, "", figures)
