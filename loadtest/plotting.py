"""The benchmarks' figures, drawn off screen: every plot is opened, laid out and saved the same way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["saved_figure"]


@contextlib.contextmanager
def saved_figure(
    path: Path,
    *grid: int,
    dpi: int,
    rect: tuple[float, float, float, float] | None = None,
    **subplots: Any,
) -> Iterator[tuple[Any, Any]]:
    """``plt.subplots(*grid, **subplots)`` on the off-screen backend, as ``(figure, axes)``; when the
    block ends the figure is laid out tight (inside ``rect``: room left for text drawn outside the
    axes), written to ``path`` at ``dpi`` and closed.

    matplotlib is imported here, not at module level: only a benchmark that draws pays for it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(*grid, **subplots)
    try:
        yield figure, axes
        figure.tight_layout(rect=rect)
        figure.savefig(path, dpi=dpi)
    finally:
        plt.close(figure)
