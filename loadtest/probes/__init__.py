"""One-off probes run on a GPU host while a benchmark was made; their findings are recorded beside the
results they explain (benchmarks/h200/README.md). Each runs as a script."""

from __future__ import annotations

__all__: list[str] = []
