"""Single functions of the build path: configs, parity, publishing."""

from __future__ import annotations

import numpy as np
import pytest

from builders.errors import UnknownModelError
from builders.parity import compare
from builders.registry import get_spec, resolve
from builders.report import BuildReport
from builders.repository import (
    UNFINISHED,
    discard_unfinished,
    discard_version,
    latest_version,
    mark_finished,
    publish,
    unfinished_versions,
    versions,
)
from builders.spec import BatchingPolicy, TensorSpec, Tolerance
from builders.triton_config import ConfigOptions, model_config, read_config, write_config


def _config(name: str = "m"):
    return model_config(
        name,
        inputs=[TensorSpec("input", "float32", (3, 8, 8))],
        outputs=[TensorSpec("logits", "float32", (10,))],
        batching=BatchingPolicy(
            max_batch_size=8, preferred_batch_sizes=(4, 8), max_queue_delay_us=1000
        ),
        options=ConfigOptions(
            platform="onnxruntime_onnx", parameters={"intra_op_thread_count": "1"}
        ),
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
        publish(
            repository,
            _config(),
            {"model.onnx": artifact},
            BuildReport(model="m", family="t", version=version),
            keep_versions=3,
        )
    assert versions(repository, "m") == [3, 4, 5]
    assert latest_version(repository, "m") == 5
    report = BuildReport.read(repository / "m" / "5" / "build_report.json")
    assert report.artifacts["model"]["bytes"] == len(b"weights")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m-")], (
        "staging folders are cleaned up"
    )


def _published(tmp_path, versions_: range, *, unfinished: int | None = None):
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(b"weights")
    repository = tmp_path / "repo"
    for version in versions_:
        publish(
            repository,
            _config(),
            {"model.onnx": artifact},
            BuildReport(model="m", family="t", version=version),
        )
    if unfinished is not None:
        publish(
            repository,
            _config(),
            {"model.onnx": artifact},
            BuildReport(model="m", family="t", version=unfinished),
            unfinished=True,
        )
    return repository


def test_an_unfinished_version_is_no_version_and_the_config_on_disk_serves_the_finished_ones(
    tmp_path,
) -> None:
    """A Triton that starts on the repository mid-promotion (a restarted pod) loads N, never N+1."""
    repository = _published(tmp_path, range(1, 3), unfinished=3)
    assert versions(repository, "m") == [1, 2] and latest_version(repository, "m") == 2
    assert unfinished_versions(repository, "m") == [3]
    on_disk = read_config(repository / "m" / "config.pbtxt")
    assert list(on_disk.version_policy.specific.versions) == [
        2
    ]  # what its own policy (the newest) picks
    # The builders' next version skips nothing and prunes nothing unfinished.
    publish(
        repository,
        _config(),
        {"model.onnx": tmp_path / "model.onnx"},
        BuildReport(model="m", family="t", version=3),
        keep_versions=1,
    )
    assert versions(repository, "m") == [3] and not (repository / "m" / "3" / UNFINISHED).exists()


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ({"latest": {"num_versions": 2}}, [2, 3]),
        ({"all": {}}, [1, 2, 3]),
        ({"specific": {"versions": [1, 4]}}, [1]),
    ],
)
def test_the_pin_keeps_what_the_entrys_own_policy_serves_among_finished_versions(
    tmp_path, policy, served
) -> None:
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = _config()
    config.version_policy.CopyFrom(json_format.ParseDict(policy, mc.ModelVersionPolicy()))
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(b"weights")
    repository = tmp_path / "repo"
    for version in range(1, 5):
        publish(
            repository,
            config,
            {"model.onnx": artifact},
            BuildReport(model="m", family="t", version=version),
            unfinished=version == 4,
        )
    assert (
        list(read_config(repository / "m" / "config.pbtxt").version_policy.specific.versions)
        == served
    )
    mark_finished(repository, "m", 4)
    assert read_config(repository / "m" / "config.pbtxt").version_policy == config.version_policy


def test_mark_finished_restores_the_config_then_drops_the_marker(tmp_path) -> None:
    repository = _published(tmp_path, range(1, 2), unfinished=2)
    mark_finished(repository, "m", 2)
    assert versions(repository, "m") == [1, 2] and not unfinished_versions(repository, "m")
    assert read_config(repository / "m" / "config.pbtxt").version_policy.latest.num_versions == 1


def test_discarding_an_unfinished_version_restores_the_config_and_never_touches_a_finished_one(
    tmp_path,
) -> None:
    repository = _published(tmp_path, range(1, 2), unfinished=2)
    with pytest.raises(ValueError, match="finished version"):
        discard_version(repository, "m", 1)
    assert discard_unfinished(repository) == [repository / "m" / "2"]
    assert not (repository / "m" / "2").exists() and versions(repository, "m") == [1]
    assert read_config(repository / "m" / "config.pbtxt").version_policy.latest.num_versions == 1
    assert not discard_version(repository, "m", 2)


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'nope'.*efficientnet_lite0"):
        get_spec("nope")


def test_resolve_puts_dependencies_first() -> None:
    names = [s.name for s in resolve(["image_classifier"])]
    assert names.index("image_preprocess") < names.index("image_classifier")
    assert names.index("efficientnet_lite0") < names.index("image_classifier")
    assert names.count("image_classifier") == 1
