"""The canary's verdict from the gateway's outcome counts (one function; the gateway is a stub that
replays counts: the rollout tests drive the real one)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from promote.canary import CanaryWatch
from promote.gates import PromotionPolicy

ROUTES = {"m": ("1", "2"), "ens": ("1", "model:ens__canary")}


@dataclass
class _Replay:
    """``outcomes(model)`` answers from ``snapshots`` in turn: the watch reads all models per snapshot."""

    snapshots: list[dict[str, dict[str, tuple[int, int]]]]
    calls: int = field(default=0)

    def outcomes(self, model: str) -> dict[str, tuple[int, int]]:
        snapshot = self.snapshots[min(self.calls // len(ROUTES), len(self.snapshots) - 1)]
        self.calls += 1
        return snapshot.get(model, {})


def _verdict(after: dict[str, dict[str, tuple[int, int]]], **policy: float):
    before = {"m": {"1": (100, 0), "2": (3, 3)}}  # counted before the watch began: not the canary's
    watch = CanaryWatch(_Replay([before, after]), ROUTES)  # type: ignore[arg-type]
    return watch.wait(PromotionPolicy(canary_duration_s=0, canary_timeout_s=0, **policy))


@pytest.mark.parametrize("allowed", [0.0, 0.05, 0.2])
def test_a_canary_failing_more_than_allowed_fails_whatever_the_allowance(allowed: float) -> None:
    after = {"m": {"1": (190, 0), "2": (9, 7)}, "ens": {"1": (50, 0), "model:ens__canary": (10, 0)}}
    verdict = _verdict(after, max_canary_error_rate=allowed)
    # 4 of 20 canary requests failed since the watch began (the 3 before it do not count): 0.2
    assert verdict.figures["canary_requests"] == 20 and verdict.figures["canary_failed"] == 4
    assert verdict.figures["canary_error_rate"] == pytest.approx(0.2)
    assert verdict.passed is (allowed >= 0.2)


def test_the_allowance_is_over_productions_own_error_rate() -> None:
    after = {"m": {"1": (190, 10), "2": (12, 4)}}  # production 10 of 100 failed, canary 1 of 10
    assert _verdict(after, max_canary_error_rate=0.0).passed
    assert (
        _verdict({"m": {"1": (200, 0), "2": (12, 4)}}, max_canary_error_rate=0.05).passed is False
    )


def test_a_canary_nobody_called_fails() -> None:
    verdict = _verdict({"m": {"1": (150, 0), "2": (3, 3)}}, min_canary_requests=1)
    assert not verdict.passed and "0 requests" in verdict.reason
