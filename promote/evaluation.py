"""Run a family's evaluation (:mod:`builders.evaluation`) through Triton: production vs another version.

The accuracy gate runs it on the candidate (loaded under a temporary name), and the smoke test runs
it again on version N+1 once it is published and loaded under the production name: both must pass
the same comparison against production.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.http as http
from tritonclient.utils import np_to_triton_dtype

from builders.evaluation import ClassAgreement, EmbeddingCosine, Evaluation, Metric, OutputParity
from builders.spec import ModelSpec
from promote.golden import golden_set
from serving.triton_clients import triton_client

__all__ = ["EvaluationData", "Outcome", "compare", "evaluation_data", "infer_batch"]

_TOP_K = 5


@dataclass(frozen=True)
class EvaluationData:
    """The inputs both versions get, the metric, and (classifiers) the accepted classes per row."""

    metric: Metric
    inputs: dict[str, np.ndarray]
    labels: tuple[frozenset[int] | None, ...] = ()
    max_batch: int = 0

    @property
    def rows(self) -> int:
        return len(next(iter(self.inputs.values())))

    def first_row(self) -> dict[str, np.ndarray]:
        """One request's worth (batch 1): what the latency gate sends."""
        return {name: np.ascontiguousarray(array[:1]) for name, array in self.inputs.items()}


@dataclass(frozen=True)
class Outcome:
    """Whether a check passed, why not, and the figures it was judged on."""

    passed: bool
    reason: str
    figures: dict[str, Any]


def evaluation_data(spec: ModelSpec) -> EvaluationData:
    """The spec's evaluation with its inputs made (the golden photographs, for image classifiers).

    Raises:
        NotImplementedError: the spec's family does not say how it is judged.
    """
    evaluation: Evaluation = spec.evaluation()
    if evaluation.photos is not None:
        golden = golden_set(evaluation.photos)
        inputs = {
            evaluation.photo_input: np.stack([item.pixels for item in golden]).astype(np.float32)
        }
        labels: tuple[frozenset[int] | None, ...] = tuple(item.accepted for item in golden)
    else:
        inputs, labels = {k: np.ascontiguousarray(v) for k, v in evaluation.inputs.items()}, ()
    if not inputs:
        raise NotImplementedError(f"{spec.name}: its evaluation has no inputs")
    return EvaluationData(evaluation.metric, inputs, labels, spec.batching.max_batch_size)


def infer_batch(url: str, model: str, version: str, data: EvaluationData) -> np.ndarray:
    """The metric's output of ``model`` (``version``) for every row, in requests of at most
    ``max_batch`` rows."""
    client = triton_client(url, network_timeout=300)
    step = data.max_batch or data.rows
    parts = []
    try:
        for start in range(0, data.rows, step):
            tensors = []
            for name, array in data.inputs.items():
                rows = np.ascontiguousarray(array[start : start + step])
                tensor = http.InferInput(name, list(rows.shape), np_to_triton_dtype(rows.dtype))
                tensor.set_data_from_numpy(rows)
                tensors.append(tensor)
            output = data.metric.output
            result = client.infer(
                model, tensors, model_version=version, outputs=[http.InferRequestedOutput(output)]
            )
            parts.append(np.asarray(result.as_numpy(output)))
    finally:
        client.close()
    return np.concatenate(parts)


def compare(data: EvaluationData, production: np.ndarray, other: np.ndarray) -> Outcome:
    """Judge ``other``'s answers against ``production``'s by the family's metric."""
    metric = data.metric
    if isinstance(metric, ClassAgreement):
        return _classes(metric, data, production, other)
    if isinstance(metric, EmbeddingCosine):
        return _embeddings(metric, data, production, other)
    return _parity(metric, production, other)


def _classes(
    metric: ClassAgreement, data: EvaluationData, production: np.ndarray, other: np.ndarray
) -> Outcome:
    prod_top1, other_top1 = production.argmax(axis=1), other.argmax(axis=1)
    other_top5 = np.argsort(other, axis=1)[:, -_TOP_K:]
    labelled = [i for i, accepted in enumerate(data.labels) if accepted]

    def accuracy(top1: np.ndarray) -> float:
        hits = [int(top1[i]) in data.labels[i] for i in labelled]  # type: ignore[operator]
        return float(np.mean(hits)) if labelled else 1.0

    figures = {
        "inputs": int(len(production)),
        "top1_agreement": float(np.mean(prod_top1 == other_top1)),
        "top5_agreement": float(
            np.mean([p in row for p, row in zip(prod_top1, other_top5, strict=True)])
        ),
        "labelled_inputs": len(labelled),
        "production_accuracy": accuracy(prod_top1),
        "candidate_accuracy": accuracy(other_top1),
    }
    problems = []
    if figures["candidate_accuracy"] < figures["production_accuracy"] - metric.max_accuracy_drop:
        problems.append(
            f"accuracy {figures['candidate_accuracy']:.3f} < production {figures['production_accuracy']:.3f}"
            f" - {metric.max_accuracy_drop}"
        )
    if figures["top1_agreement"] < metric.min_top1:
        problems.append(
            f"top-1 agreement with production {figures['top1_agreement']:.3f} < {metric.min_top1}"
        )
    if figures["top5_agreement"] < metric.min_top5:
        problems.append(
            f"top-5 agreement with production {figures['top5_agreement']:.3f} < {metric.min_top5}"
        )
    return Outcome(not problems, "; ".join(problems), figures)


def _pooled(vectors: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    vectors = vectors.astype(np.float64)
    if mask is not None:
        weights = mask.astype(np.float64)[..., None]
        vectors = (vectors * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-12)
    vectors = vectors.reshape(len(vectors), -1)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def _embeddings(
    metric: EmbeddingCosine, data: EvaluationData, production: np.ndarray, other: np.ndarray
) -> Outcome:
    mask = data.inputs[metric.mask] if metric.mask else None
    cosines = np.sum(_pooled(production, mask) * _pooled(other, mask), axis=1)
    figures = {
        "inputs": int(len(cosines)),
        "min_cosine": float(cosines.min()),
        "mean_cosine": float(cosines.mean()),
    }
    passed = figures["min_cosine"] >= metric.min_cosine
    reason = (
        ""
        if passed
        else f"embedding cosine with production {figures['min_cosine']:.5f} < {metric.min_cosine}"
    )
    return Outcome(passed, reason, figures)


def _parity(metric: OutputParity, production: np.ndarray, other: np.ndarray) -> Outcome:
    production, other = production.astype(np.float64), other.astype(np.float64)
    if production.shape != other.shape:
        return Outcome(
            False, f"output shape {list(other.shape)} != production {list(production.shape)}", {}
        )
    mse = float(np.mean((production - other) ** 2))
    peak = float(production.max() - production.min()) or 1.0
    psnr = math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)
    figures = {
        "inputs": int(len(production)),
        "psnr_db": psnr if math.isfinite(psnr) else "identical",
        "max_abs_error": float(np.abs(production - other).max()),
    }
    passed = psnr >= metric.min_psnr_db
    reason = "" if passed else f"PSNR against production {psnr:.1f} dB < {metric.min_psnr_db} dB"
    return Outcome(passed, reason, figures)
