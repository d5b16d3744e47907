"""One load point's time, split from snapshots taken around it: Triton's statistics for the model (and
its own steps where it reports them, :mod:`loadtest.bench.triton_split`) and, for a point that goes
through the gateway, the gateway's stage counters (:mod:`loadtest.bench.gateway_split`).

    probe = PointProbe.start(triton.http_url, model, triton.metrics_url, gateway=(url, metrics_token))
    result = run_load(spec, clients)
    row = probe.row(name, concurrency, result.mean_ms)   # what the benchmarks keep in bench.json

Used by every benchmark that splits its points (the GPU benchmark, the side-by-side benchmark), so
the rows and their tables are the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadtest.bench.gateway_split import gateway_counters, gateway_split
from loadtest.bench.triton_split import model_counters, split

__all__ = ["PointProbe"]


@dataclass(frozen=True)
class PointProbe:
    """The counters before one load point; :meth:`row` reads them again after it.

    Attributes:
        triton_url: Triton's HTTP address.
        model: the model the point's requests reach.
        metrics_url: Triton's metrics page (the model's step metrics), or None.
        gateway: the gateway's base URL and ``/metrics`` token, for a point that goes through it.
    """

    triton_url: str
    model: str
    metrics_url: str | None = None
    gateway: tuple[str, str] | None = None
    triton_before: dict[str, float] = field(default_factory=dict)
    gateway_before: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        triton_url: str,
        model: str,
        metrics_url: str | None = None,
        gateway: tuple[str, str] | None = None,
    ) -> PointProbe:
        """Snapshot the counters now, before the point's load."""
        return cls(
            triton_url,
            model,
            metrics_url,
            gateway,
            model_counters(triton_url, model, metrics_url),
            gateway_counters(*gateway) if gateway is not None else {},
        )

    def row(self, config: str, concurrency: int, client_mean_ms: float) -> dict[str, Any]:
        """The point's split: Triton's stages (:meth:`TritonSplit.as_dict`) and, through the gateway,
        ``gateway`` (:meth:`GatewaySplit.as_dict`)."""
        inside = split(
            self.model,
            self.triton_before,
            model_counters(self.triton_url, self.model, self.metrics_url),
        )
        row: dict[str, Any] = {
            "config": config,
            "concurrency": concurrency,
            **inside.as_dict(client_mean_ms),
        }
        if self.gateway is not None:
            stages = gateway_split(self.gateway_before, gateway_counters(*self.gateway))
            row["gateway"] = stages.as_dict(client_mean_ms, inside.in_triton_ms)
        return row
