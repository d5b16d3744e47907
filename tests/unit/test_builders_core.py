"""Single functions of the build path: configs, parity, publishing."""

from __future__ import annotations

import numpy as np
import pytest

from builders.errors import UnknownModelError
from builders.parity import compare
from builders.registry import get_spec, resolve
from builders.report import BuildReport
from builders.repository import latest_version, publish, versions
from builders.spec import BatchingPolicy, TensorSpec, Tolerance
from builders.triton_config import model_config, read_config, write_config


def _config(name: str = "m"):
    return model_config(
        name,
        platform="onnxruntime_onnx",
        inputs=[TensorSpec("input", "float32", (3, 8, 8))],
        outputs=[TensorSpec("logits", "float32", (10,))],
        batching=BatchingPolicy(max_batch_size=8, preferred_batch_sizes=(4, 8), max_queue_delay_us=1000),
        parameters={"intra_op_thread_count": "1"},
    )


def test_config_round_trips_through_tritons_schema(tmp_path) -> None:
    path = write_config(_config(), tmp_path / "config.pbtxt")
    parsed = read_config(path)
    assert parsed.max_batch_size == 8
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4, 8]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 1000
    assert parsed.parameters["intra_op_thread_count"].string_value == "1"
    assert parsed.model_warmup[0].inputs["input"].zero_data
    assert parsed.version_policy.latest.num_versions == 1


def test_parity_flags_drift_and_top1_disagreement() -> None:
    ref = np.array([[0.0, 1.0, 0.2], [2.0, 0.1, 0.0]])
    assert compare(ref, ref, classes=True).failures(Tolerance()) == []
    swapped = ref[:, [1, 0, 2]]
    problems = compare(ref, swapped, classes=True).failures(Tolerance())
    assert any("top-1" in p for p in problems) and any("max abs" in p for p in problems)


def test_parity_refuses_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        compare(np.zeros((2, 3)), np.zeros((2, 4)))


def test_publish_adds_versions_and_prunes_old_ones(tmp_path) -> None:
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(b"weights")
    repository = tmp_path / "repo"
    for version in range(1, 6):
        publish(repository, _config(), {"model.onnx": artifact}, BuildReport(model="m", family="t", version=version),
                keep_versions=3)
    assert versions(repository, "m") == [3, 4, 5]
    assert latest_version(repository, "m") == 5
    report = BuildReport.read(repository / "m" / "5" / "build_report.json")
    assert report.artifacts["model"]["bytes"] == len(b"weights")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m-")], "staging folders are cleaned up"


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'nope'.*efficientnet_lite0"):
        get_spec("nope")


def test_resolve_puts_dependencies_first() -> None:
    names = [s.name for s in resolve(["image_classifier"])]
    assert names.index("image_preprocess") < names.index("image_classifier")
    assert names.index("efficientnet_lite0") < names.index("image_classifier")
    assert names.count("image_classifier") == 1
