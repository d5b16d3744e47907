"""The gates, on real candidate builds and a real Triton: a classifier with the wrong weights and one
four times slower are refused; an encoder and a diffusion network are judged by their own families'
evaluations (embedding cosine on held-out sentences, PSNR at a fixed seed) and pass.

Gates never change production, so these run against the session's Triton and its repository.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builders.evaluation import ClassAgreement, EmbeddingCosine, OutputParity
from builders.registry import available, get_spec
from builders.repository import versions
from builders.spec import ModelSpec
from promote.evaluation import EvaluationData, compare
from promote.gates import PromotionPolicy
from promote.promoter import PromotionError, PromotionOptions, PromotionTarget, promote
from serving.launcher import TritonServer
from tests.support.promotion import (
    CLASSIFIER,
    CandidateBuilds,
    CorruptedWeights,
    FourTimesSlower,
    copy_entries,
)

# Short, alternating load rounds, bounded for CI. The budgets (P99 at most 2x, throughput at least half)
# still refuse the 4x slower candidate, and leave room for a noisy shared machine to slow one round.
POLICY = PromotionPolicy(
    load_duration_s=2.0,
    load_rounds=3,
    load_concurrency=4,
    max_p99_regression=1.0,
    max_throughput_drop=0.5,
)


def _target(repository: Path, server: TritonServer, tmp_path: Path) -> PromotionTarget:
    return PromotionTarget(repository, server.http_url, tmp_path / "records")


@pytest.mark.integration
def test_corrupted_weights_are_refused_and_never_served(
    model_repository: Path, triton: TritonServer, candidate_builds: CandidateBuilds, tmp_path: Path
) -> None:
    before = versions(model_repository, CLASSIFIER)
    record = promote(
        CLASSIFIER,
        candidate_builds(CorruptedWeights),
        _target(model_repository, triton, tmp_path),
        policy=POLICY,
    )
    assert record.decision == "refused"
    assert record.gates["parity"]["passed"], (
        "the export itself is faithful; the model is what is bad"
    )
    accuracy = record.gates["accuracy"]
    assert not accuracy["passed"] and accuracy["figures"]["metric"] == "ClassAgreement"
    assert accuracy["figures"]["top1_agreement"] < 0.5
    assert "accuracy" in record.reason and record.new_version is None
    assert versions(model_repository, CLASSIFIER) == before


@pytest.mark.integration
def test_a_latency_regression_is_refused(
    model_repository: Path, triton: TritonServer, candidate_builds: CandidateBuilds, tmp_path: Path
) -> None:
    before = versions(model_repository, CLASSIFIER)
    record = promote(
        CLASSIFIER,
        candidate_builds(FourTimesSlower),
        _target(model_repository, triton, tmp_path),
        policy=POLICY,
    )
    assert record.decision == "refused", record.gates
    assert record.gates["accuracy"]["passed"]
    assert record.gates["accuracy"]["figures"]["top5_agreement"] == 1.0
    assert not record.gates["latency"]["passed"]
    assert versions(model_repository, CLASSIFIER) == before


@pytest.mark.integration
def test_an_encoder_is_judged_by_embedding_cosine_on_held_out_sentences(
    model_repository: Path, triton: TritonServer, tmp_path: Path
) -> None:
    candidate = copy_entries(model_repository, tmp_path / "candidate", ["minilm_encoder"])
    record = promote(
        "minilm_encoder",
        candidate,
        _target(model_repository, triton, tmp_path),
        policy=POLICY,
        options=PromotionOptions(gates=("parity", "accuracy"), publish=False),
    )
    assert record.decision == "gates-passed", record.reason
    figures = record.gates["accuracy"]["figures"]
    assert (
        figures["metric"] == "EmbeddingCosine"
        and figures["inputs"] == 12
        and figures["min_cosine"] > 0.9999
    )


@pytest.mark.integration
def test_a_diffusion_network_is_judged_by_psnr_at_a_fixed_seed(
    sd_repository: Path, sd_triton: TritonServer, sd_checkpoint: Path, tmp_path: Path
) -> None:
    candidate = copy_entries(sd_repository, tmp_path / "candidate", ["sd_vae_decoder"])
    record = promote(
        "sd_vae_decoder",
        candidate,
        _target(sd_repository, sd_triton, tmp_path),
        policy=POLICY,
        options=PromotionOptions(
            gates=("parity", "accuracy"),
            publish=False,
            weights={"stable_diffusion": str(sd_checkpoint)},
        ),
    )
    assert record.decision == "gates-passed", record.reason
    figures = record.gates["accuracy"]["figures"]
    assert figures["metric"] == "OutputParity" and figures["psnr_db"] == "identical"


def test_pipelines_are_not_promoted_and_every_network_family_says_how_it_is_judged(
    tmp_path: Path,
) -> None:
    with pytest.raises(PromotionError, match="pipeline"):
        promote("image_classifier", tmp_path, PromotionTarget(tmp_path, "127.0.0.1:1", tmp_path))
    # Every network the registry builds (not the pipelines) overrides ModelSpec.evaluation.
    from builders.families import diffusion

    networks = [
        type(get_spec(name))
        for name in available()
        if not name.startswith(("sd_", "stable_diffusion"))
    ]
    networks = [n for n in networks if issubclass(n, ModelSpec)]
    networks += [diffusion.SDTextEncoder, diffusion.SDUNet, diffusion.SDVAEDecoder]
    assert len(networks) >= 6
    assert all(n.evaluation is not ModelSpec.evaluation for n in networks), networks


def _data(metric: object, rows: int = 4, **inputs: np.ndarray) -> EvaluationData:
    return EvaluationData(metric, inputs or {"x": np.zeros((rows, 1))})  # type: ignore[arg-type]


def test_class_agreement_counts_top1_top5_and_labelled_accuracy() -> None:
    production = np.eye(4, 10)  # top-1: 0, 1, 2, 3
    other = production.copy()
    other[0, 9] = 2.0  # row 0 now says 9 (0 still in its top 5)
    data = EvaluationData(
        ClassAgreement(output="logits", min_top1=0.9),
        {"x": np.zeros((4, 1))},
        labels=(frozenset({0}), None, None, None),
    )
    outcome = compare(data, production, other)
    assert outcome.figures["top1_agreement"] == 0.75 and outcome.figures["top5_agreement"] == 1.0
    assert (
        outcome.figures["production_accuracy"] == 1.0
        and outcome.figures["candidate_accuracy"] == 0.0
    )
    assert not outcome.passed and "accuracy" in outcome.reason and "top-1" in outcome.reason


def test_embedding_cosine_pools_over_the_mask() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.normal(size=(3, 5, 8))
    mask = np.array([[1, 1, 1, 0, 0]] * 3)
    padded = tokens.copy()
    padded[:, 3:] = 100.0  # padding positions differ wildly: masked out, so no difference
    metric = EmbeddingCosine(output="h", mask="attention_mask", min_cosine=0.999)
    assert compare(_data(metric, attention_mask=mask), tokens, padded).passed
    shifted = tokens + rng.normal(scale=1.0, size=tokens.shape)
    outcome = compare(_data(metric, attention_mask=mask), tokens, shifted)
    assert not outcome.passed and outcome.figures["min_cosine"] < 0.999


def test_output_parity_is_psnr_against_production() -> None:
    production = np.linspace(-1, 1, 1000).reshape(2, 500)
    metric = OutputParity(output="image", min_psnr_db=40.0)
    assert compare(_data(metric), production, production + 1e-4).passed  # ~80 dB
    outcome = compare(_data(metric), production, production + 0.05)
    assert not outcome.passed and 25 < outcome.figures["psnr_db"] < 35
