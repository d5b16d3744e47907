"""One measured point of the diffusion benchmark, how images are compared and how ``bench.txt`` lays
out its summary: shared by the runs (:mod:`loadtest.diffusion_bench`, :mod:`loadtest.diffusion_process`)
and their reports, below them all."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ALONE_RATIO_TARGET", "Point", "psnr", "summary_lines", "target_lines"]

#: Triton's seconds per image alone may be this much over diffusers' (the target)
ALONE_RATIO_TARGET = 1.1


@dataclass
class Point:
    """One system at one size, step count and concurrency (batch)."""

    system: str
    size: str
    steps: int
    concurrency: int
    images: int
    wall_s: float
    latencies_s: list[float]
    stats: dict[str, float] = field(default_factory=dict)
    loops: list[dict[str, Any]] = field(default_factory=list)

    @property
    def seconds_per_image(self) -> float:
        return self.wall_s / self.images

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images, in dB (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def target_lines(targets: Iterable[Mapping[str, Any]]) -> list[str]:
    """Each target, met or MISSED, with the figure it was judged on."""
    return [f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {t['value']}" for t in targets]


def summary_lines(table: str, sections: Mapping[str, list[str]]) -> list[str]:
    """``bench.txt``: the table, then each section after a blank line, its title and its lines."""
    lines = [table]
    for title, body in sections.items():
        lines += ["", title, *body]
    return lines
