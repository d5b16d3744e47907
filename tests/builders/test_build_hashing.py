"""A build hashes every file it depends on: a change to the shared preprocessing makes every entry
built through it stale (the classifiers, their precision variants, the preprocessing model and the
ensemble), and nothing else. Checked on the real test repository, without rebuilding it."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.pipeline import BuildOptions, stale
from builders.triton_config import read_config
from serving import image_preprocessing
from serving.image_preprocessing import Preprocessing
from serving.limits import DEFAULT_LIMITS

NAMES = ["image_classifier", "resnet50"]


def test_nothing_is_stale_right_after_a_build(model_repository: Path) -> None:
    assert stale(NAMES, BuildOptions(repository=model_repository)) == []


def test_a_change_to_the_preprocessing_makes_its_dependents_stale(
    model_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edited = tmp_path / "image_preprocessing.py"
    edited.write_text(
        Path(image_preprocessing.__file__).read_text() + "\n# a changed resize would go here\n"
    )
    monkeypatch.setattr(image_preprocessing, "__file__", str(edited))
    found = stale(NAMES, BuildOptions(repository=model_repository))
    assert sorted(found) == sorted(
        [
            "image_preprocess",
            "efficientnet_lite0",
            "efficientnet_lite0_fp16",
            "efficientnet_lite0_int8",
            "image_classifier",
            "resnet50",
        ]
    )  # image_postprocess does not depend on it


def test_the_preprocessing_entry_ships_the_module_and_the_limits(model_repository: Path) -> None:
    entry = model_repository / "image_preprocess"
    config = read_config(entry / "config.pbtxt")
    version = max(int(p.name) for p in entry.iterdir() if p.name.isdigit())
    shipped = entry / str(version) / "image_preprocessing.py"
    assert shipped.read_bytes() == Path(image_preprocessing.__file__).read_bytes()
    params = {key: value.string_value for key, value in config.parameters.items()}
    limits = DEFAULT_LIMITS.image_decode
    assert int(params["max_source_pixels"]) == limits.max_source_pixels
    assert float(params["max_aspect_ratio"]) == limits.max_aspect_ratio
    assert int(params["max_resized_pixels"]) == limits.max_resized_pixels
    assert Preprocessing.from_parameters(params) == Preprocessing()


def test_a_gpu_host_repository_is_another_build(model_repository: Path) -> None:
    found = stale(["efficientnet_lite0"], BuildOptions(repository=model_repository, gpu=True))
    assert found == ["efficientnet_lite0", "efficientnet_lite0_fp16", "efficientnet_lite0_int8"]


def test_an_int8_calibration_study_is_another_int8_build(model_repository: Path) -> None:
    found = stale(
        ["efficientnet_lite0"],
        BuildOptions(repository=model_repository, int8_calibration_study=True),
    )
    # The variants hash their spec (the methods are part of it); the FP32 entry is not rebuilt.
    assert "efficientnet_lite0_int8" in found and "efficientnet_lite0" not in found, found


def test_a_change_to_the_tokenization_makes_the_text_entries_stale(
    model_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from serving import text_tokenization

    edited = tmp_path / "text_tokenization.py"
    edited.write_text(
        Path(text_tokenization.__file__).read_text() + "\n# a changed truncation would go here\n"
    )
    monkeypatch.setattr(text_tokenization, "__file__", str(edited))
    found = stale(
        ["text_embedding", "text_embedding_fp16", "image_classifier"],
        BuildOptions(repository=model_repository),
    )
    assert sorted(found) == sorted(
        [
            "text_tokenizer",
            "minilm_encoder",
            "minilm_encoder_fp16",
            "text_embedding",
            "text_embedding_fp16",
        ]
    )  # text_pooling and the image entries do not depend on it


def test_a_repository_for_native_backends_has_no_ragged_encoder(model_repository: Path) -> None:
    """NGC's native backends take a ragged input only as one flat tensor: such a repository is another
    build of the encoder, whose config lets the batcher merge equal lengths only."""
    from builders.context import onnx_entry_config
    from builders.families.text_embedding import MiniLMEncoder

    found = stale(
        ["text_embedding"], BuildOptions(repository=model_repository, native_backends=True)
    )
    assert "minilm_encoder" in found and "efficientnet_lite0" not in found
    spec = MiniLMEncoder()
    built = read_config(model_repository / "minilm_encoder" / "config.pbtxt")
    assert [i.allow_ragged_batch for i in built.input] == [True, True, True]
    native = onnx_entry_config(spec, spec.name, "fp32", gpu=False, ragged=False)
    assert not any(i.allow_ragged_batch for i in native.input)
