"""The one build path: build_model walks any flavour's steps in order, skips a current entry without
loading it, and publishes nothing when a later step fails. Unit tests with a recording flavour (the
real flavours are built end to end by the other tests of this folder)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from builders import repository as repo
from builders.context import GroundTruth
from builders.errors import ParityError
from builders.flavours import Artifact, BuildRun, Loaded, build_model
from builders.flavours.base import ParentEntry, next_version
from builders.parity import ParityResult
from builders.publication import Publication
from builders.report import BuildReport
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec, WeightsInfo
from builders.triton_config import ConfigOptions, model_config


class _Spec(ModelSpec):
    name = "walked"
    family = "test"
    inputs = (TensorSpec("input", "float32", (4,)),)
    outputs = (TensorSpec("output", "float32", (4,)),)
    batching = BatchingPolicy(max_batch_size=4)

    def load(self):  # type: ignore[override]
        raise AssertionError("the recording flavour loads nothing itself")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"input": np.zeros((2, 4), np.float32)}


class _Recording:
    """A flavour that records its steps; ``fail_in`` names the step that raises."""

    exporting = "making"

    def __init__(self, digest: str | None = "d1", fail_in: str = "") -> None:
        self._digest, self.fail_in, self.steps = digest, fail_in, list[str]()

    def _step(self, name: str) -> None:
        self.steps.append(name)
        if name == self.fail_in:
            raise ParityError(f"{name} failed")

    def entry_name(self, spec: ModelSpec) -> str:
        return spec.name

    def digest(self, spec: ModelSpec) -> str | None:
        return self._digest

    def current_variants(
        self, spec: ModelSpec, digest: str, run: BuildRun
    ) -> list[BuildReport] | None:
        self._step("current_variants")
        return []

    def load(self, spec: ModelSpec) -> Loaded:
        self._step("load")
        return Loaded(
            None, WeightsInfo("random-init", False), GroundTruth(spec.sample_inputs(), [])
        )

    def export(self, spec: ModelSpec, loaded: Loaded, workdir: Path, run: BuildRun) -> Artifact:
        self._step("export")
        path = workdir / "model.bin"
        path.write_bytes(b"made")
        return Artifact(files={"model.bin": path})

    def verify(
        self, spec: ModelSpec, loaded: Loaded, artifact: Artifact
    ) -> dict[str, ParityResult]:
        self._step("verify")
        return {}

    def entry(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        artifact: Artifact,
        parity: Mapping[str, ParityResult],
        digest: str,
        run: BuildRun,
    ) -> Publication:
        self._step("entry")
        report = BuildReport(
            model=spec.name,
            family=spec.family,
            version=next_version(run.repository, spec.name),
            inputs_hash=digest,
        )
        config = model_config(
            spec.name,
            inputs=spec.inputs,
            outputs=spec.outputs,
            batching=spec.batching,
            options=ConfigOptions(platform="onnxruntime_onnx"),
        )
        return Publication(report, config, artifact.files)

    def variants(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        parent: ParentEntry[Artifact],
        workdir: Path,
        run: BuildRun,
    ) -> list[Publication]:
        self._step("variants")
        return []


def test_the_steps_run_in_order_and_a_current_entry_is_not_loaded_again(tmp_path: Path) -> None:
    flavour, messages = _Recording(), list[str]()
    run = BuildRun(tmp_path, status=messages.append)
    (built,) = build_model(_Spec(), flavour, run)
    assert flavour.steps == ["load", "export", "verify", "entry", "variants"]
    assert messages == [
        "walked: loading weights",
        "walked: making",
        "walked: checking parity",
        "walked: publishing",
    ]
    assert built.version == 1 and not built.skipped
    assert (tmp_path / "walked" / "1" / "model.bin").read_bytes() == b"made"

    again = _Recording()
    (current,) = build_model(_Spec(), again, BuildRun(tmp_path))
    assert again.steps == ["current_variants"] and current.skipped and current.version == 1


def test_force_and_a_missing_digest_build_a_new_version(tmp_path: Path) -> None:
    build_model(_Spec(), _Recording(), BuildRun(tmp_path))
    (forced,) = build_model(_Spec(), _Recording(), BuildRun(tmp_path, force=True))
    (unhashed,) = build_model(_Spec(), _Recording(digest=None), BuildRun(tmp_path))
    assert (forced.version, unhashed.version) == (2, 3)
    assert repo.versions(tmp_path, "walked") == [1, 2, 3]


@pytest.mark.parametrize("step", ["export", "verify", "entry", "variants"])
def test_a_failed_step_publishes_nothing(tmp_path: Path, step: str) -> None:
    with pytest.raises(ParityError, match=f"{step} failed"):
        build_model(_Spec(), _Recording(fail_in=step), BuildRun(tmp_path))
    assert not (tmp_path / "walked").exists()
