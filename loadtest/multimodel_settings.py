"""What ``loadtest.multimodel`` runs: its settings, apart so the run and its report both read them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_SETTINGS", "MultiModelSettings"]


@dataclass(frozen=True, kw_only=True)
class MultiModelSettings:
    """What the benchmark runs (the issue's full scale: 20 models, a budget of 5, 60 s)."""

    models: int = 20
    budget_models: int = 5
    concurrency: int = 8
    duration_s: float = 60.0
    warmup_s: float = 10.0
    zipf_s: float = 1.1
    hidden: int = 256
    seed: int = 0
    device: str = "cpu"
    concurrent_loads: int = 1
    out_dir: Path = Path("multimodel-results")


DEFAULT_SETTINGS = MultiModelSettings()
