"""Bad build input stops with a message naming the problem and leaves the served repository untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builders import engine
from builders.engine import EngineProfile, build_engine
from builders.errors import EngineBuildError, MissingInputError, UnknownModelError
from builders.pipeline import BuildOptions, build, build_specs
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec, Tolerance, WeightsInfo
from tests.support.tensorrt import tensorrt_or_skip
from tests.support.variant_repos import copy_entries, tree_hash


@pytest.fixture
def served(model_repository: Path, tmp_path: Path) -> Path:
    """A private served repository (copies of built entries), so a failure cannot hide in shared state."""
    return copy_entries(model_repository, tmp_path / "repository")


def _options(repository: Path, **kwargs: object) -> BuildOptions:
    return BuildOptions(
        repository=repository, timing_cache=repository.parent / "timing.cache", **kwargs
    )  # type: ignore[arg-type]


def test_unknown_model_is_named_and_nothing_changes(served: Path) -> None:
    before = tree_hash(served)
    with pytest.raises(
        UnknownModelError, match="unknown model 'efficientnet_lite9'.*efficientnet_lite0"
    ):
        build(["efficientnet_lite0", "efficientnet_lite9"], _options(served, engines=True))
    assert tree_hash(served) == before


@pytest.mark.parametrize("kind", ["checkpoint folder", "weights file"])
def test_missing_resnet50_weights_are_named_and_nothing_changes(
    served: Path, tmp_path: Path, kind: str
) -> None:
    missing = tmp_path / ("resnet50-checkpoint/" if kind == "checkpoint folder" else "resnet50.pt")
    before = tree_hash(served)
    with pytest.raises(MissingInputError, match=f"resnet50 weights not found: {missing}"):
        build(["resnet50"], _options(served, weights={"resnet50": str(missing)}))
    assert tree_hash(served) == before
    assert not (served / "resnet50").exists()


@pytest.mark.parametrize("content", ["garbage", "truncated"])
def test_onnx_tensorrt_cannot_read_is_named(served: Path, tmp_path: Path, content: str) -> None:
    tensorrt_or_skip()
    bad = tmp_path / "model.onnx"
    if content == "garbage":
        bad.write_bytes(b"\x08\x07 not an ONNX model at all \xff\xfe")
    else:
        real = next((served / "efficientnet_lite0_fp16").glob("*/model.onnx")).read_bytes()
        bad.write_bytes(real[: len(real) // 3])
    before = tree_hash(served)
    with pytest.raises(EngineBuildError, match="model.onnx is not a (readable|usable) ONNX model"):
        build_engine(bad, tmp_path / "out", EngineProfile(32), "fp16")
    assert not (tmp_path / "out" / engine.ENGINE_NAME).exists()
    assert tree_hash(served) == before


class _Determinant(ModelSpec):
    """A model ONNX Runtime runs but TensorRT cannot parse (ONNX ``Det`` has no TensorRT importer)."""

    name = "tiny_determinant"
    family = "test"
    inputs = (TensorSpec("input", "float32", (3, 4, 4)),)
    outputs = (TensorSpec("det", "float32", (3,)),)
    batching = BatchingPolicy(max_batch_size=4)
    variants = ("int8",)
    # Only the convolution is quantized; the test is about the engine step, not INT8 accuracy.
    int8_op_types = ("Conv",)
    variant_tolerances = {
        "int8": Tolerance(max_abs_error=1e9, min_cosine=-1.0, min_top1_agreement=0.0)
    }

    def load(self):  # type: ignore[no-untyped-def]
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 3, 1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.linalg.det(self.conv(x))

        torch.manual_seed(0)
        return Net().eval(), WeightsInfo(source="random-init", pretrained=False)

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"input": np.random.default_rng(0).normal(size=(4, 3, 4, 4)).astype(np.float32)}


def test_unparsable_variant_stops_the_build_and_publishes_nothing(served: Path) -> None:
    trt = tensorrt_or_skip()
    before = tree_hash(served)
    with pytest.raises(EngineBuildError) as caught:
        build_specs([_Determinant()], _options(served, engines=True))
    message = str(caught.value)
    assert message.startswith("tiny_determinant_trt_int8 from tiny_determinant_int8: "), message
    assert f"TensorRT ({trt.flavour} {trt.version}) cannot parse model.onnx" in message
    assert "op Det" in message
    # Neither the FP32 parent nor its verified INT8 variant went in: nothing is half-applied.
    assert tree_hash(served) == before
    assert not (served / "tiny_determinant").exists()
