"""The gateway's admin API for canary weights, as the promoter uses it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

__all__ = ["GatewayTraffic", "model_target"]

_TIMEOUT_S = 10.0


def model_target(name: str) -> str:
    """The weight key that sends a share of a model's traffic to another model (a canary pipeline)."""
    return f"model:{name}"


@dataclass(frozen=True)
class GatewayTraffic:
    """Per-model traffic weights through ``/admin/traffic`` (with Redis behind the gateway, one call
    reaches every replica within its sync interval).

    Raises (every method): ``httpx.HTTPError`` when the gateway cannot be reached or refuses.
    """

    url: str
    admin_token: str

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def split(self, model: str, weights: Mapping[int | str, float]) -> None:
        """Route ``model``'s traffic by weight: versions (ints) or :func:`model_target` keys."""
        response = httpx.put(
            f"{self.url}/admin/traffic/{model}",
            timeout=_TIMEOUT_S,
            headers=self._headers(),
            json={"versions": {str(v): w for v, w in weights.items()}},
        )
        response.raise_for_status()

    def outcomes(self, model: str) -> dict[str, tuple[int, int]]:
        """Requests ``model``'s weights routed, per target, since they were set: (answered, failed).

        Failed means the target's fault (an error, a timeout, not served), never a client error.
        """
        response = httpx.get(
            f"{self.url}/admin/traffic/{model}", timeout=_TIMEOUT_S, headers=self._headers()
        )
        response.raise_for_status()
        return {
            target: (int(c["answered"]), int(c["failed"]))
            for target, c in response.json()["outcomes"].items()
        }

    def clear(self, model: str) -> None:
        """Unpin ``model`` (Triton's version policy chooses again); unpinned already is fine."""
        response = httpx.delete(
            f"{self.url}/admin/traffic/{model}", timeout=_TIMEOUT_S, headers=self._headers()
        )
        if response.status_code != 404:
            response.raise_for_status()
