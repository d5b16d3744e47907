"""Per-model version weights: how a canary gets a share of traffic.

With no weights set, requests name no version and Triton answers with the version its policy
serves. While a promotion runs, the promoter sets weights (``{1: 0.9, 2: 0.1}``) and each request is
pinned to one version, drawn by weight. Held per gateway process: with several replicas the
promoter sets every replica (or runs the canary through one).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from gateway.errors import BadRequest

__all__ = ["TrafficSplit"]


class TrafficSplit:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._weights: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        self._rng = rng or random.Random()

    def set(self, model: str, weights: Mapping[str, float]) -> None:
        """Route ``model``'s traffic to versions by weight (weights need not sum to 1).

        Raises:
            BadRequest: no positive weight, a negative weight, or a version that is not a number.
        """
        for version, weight in weights.items():
            if not version.isdigit():
                raise BadRequest(f"version '{version}' is not a positive integer", field="versions")
            if weight < 0:
                raise BadRequest(f"weight of version {version} is negative", field="versions")
        kept = {v: w for v, w in weights.items() if w > 0}
        if not kept:
            raise BadRequest("at least one version needs a positive weight", field="versions")
        self._weights[model] = (tuple(kept), tuple(kept.values()))

    def clear(self, model: str) -> bool:
        """Back to unpinned routing; ``False`` when nothing was set."""
        return self._weights.pop(model, None) is not None

    def pick(self, model: str) -> str:
        """The version for one request ('' = let Triton choose)."""
        entry = self._weights.get(model)
        if entry is None:
            return ""
        versions, weights = entry
        return versions[0] if len(versions) == 1 else self._rng.choices(versions, weights)[0]

    def snapshot(self) -> dict[str, dict[str, float]]:
        total = {m: sum(w) for m, (_, w) in self._weights.items()}
        return {m: {v: w / total[m] for v, w in zip(vs, ws, strict=True)} for m, (vs, ws) in self._weights.items()}
