"""Parity between a PyTorch reference and an exported artifact, on the same real inputs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.spec import Tolerance
from serving.backends.onnxruntime.ort_providers import avoid_saturating_int8

__all__ = ["ParityResult", "compare", "run_onnx"]


@dataclass(frozen=True)
class ParityResult:
    max_abs_error: float
    mean_abs_error: float
    min_cosine: float
    top1_agreement: float | None
    samples: int
    top5_agreement: float | None = None

    def failures(self, tolerance: Tolerance) -> list[str]:
        """Human-readable reasons this result is outside ``tolerance`` (empty when it passes)."""
        problems = []
        if self.max_abs_error > tolerance.max_abs_error:
            problems.append(
                f"max abs error {self.max_abs_error:.3g} > {tolerance.max_abs_error:.3g}"
            )
        if self.min_cosine < tolerance.min_cosine:
            problems.append(f"min cosine {self.min_cosine:.6f} < {tolerance.min_cosine:.6f}")
        if self.top1_agreement is not None and self.top1_agreement < tolerance.min_top1_agreement:
            problems.append(
                f"top-1 agreement {self.top1_agreement:.3f} < {tolerance.min_top1_agreement:.3f}"
            )
        if self.top5_agreement is not None and self.top5_agreement < tolerance.min_top5_agreement:
            problems.append(
                f"top-5 agreement {self.top5_agreement:.3f} < {tolerance.min_top5_agreement:.3f}"
            )
        return problems

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(reference: np.ndarray, candidate: np.ndarray, classes: bool = False) -> ParityResult:
    """Compare two batched outputs row by row.

    Args:
        classes: the last axis holds class scores, so top-1 agreement (same best class) and top-5
            agreement (the reference's best class among the candidate's five best) are meaningful.
    """
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    cand = np.asarray(candidate, dtype=np.float64).reshape(len(candidate), -1)
    if ref.shape != cand.shape:
        raise ValueError(f"output shapes differ: reference {ref.shape}, candidate {cand.shape}")
    diff = np.abs(ref - cand)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    cosine = np.sum(ref * cand, axis=1) / np.maximum(norms, 1e-12)
    top1 = float(np.mean(ref.argmax(axis=1) == cand.argmax(axis=1))) if classes else None
    top5 = None
    if classes:
        best5 = np.argsort(-cand, axis=1)[:, :5]
        top5 = float(np.mean([r in row for r, row in zip(ref.argmax(axis=1), best5, strict=True)]))
    return ParityResult(
        max_abs_error=float(diff.max()),
        mean_abs_error=float(diff.mean()),
        min_cosine=float(cosine.min()),
        top1_agreement=top1,
        samples=len(ref),
        top5_agreement=top5,
    )


def run_onnx(
    path: Path, feeds: dict[str, np.ndarray], outputs: list[str] | None = None
) -> list[np.ndarray]:
    """Run an ONNX file once on the CPU with onnxruntime, as the ``onnxruntime`` backend runs it on
    this host."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    avoid_saturating_int8(options)
    session = ort.InferenceSession(
        str(path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return list(session.run(outputs, feeds))
