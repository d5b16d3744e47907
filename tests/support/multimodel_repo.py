"""A repository of many small models for the residency tests: each one a Python-backend model with
a known memory ballast, so its footprint is clearly measurable and far from its neighbours'.

- ``variant_<i>`` (``i`` from 0): ``X`` INT32 [1] -> ``Y`` INT32 [1] = ``X + i``; ``initialize``
  allocates (and touches) ``ballast_mb`` MiB and appends one line to ``initialized.txt`` in the
  model's folder, so a test can count the loads Triton really made. An ``X`` of -N with N >= 1000
  holds the request until :func:`release` (N) is called (bounded), so a test knows a request is in
  flight while it does something else.
- ``broken``: its ``initialize`` raises, so every load fails.
- ``pair_a`` and ``pair_b``: ensembles that both run ``variant_shared_step`` (a variant model).

Configs go through Triton's protobuf schema, as everywhere in the project.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

__all__ = [
    "BROKEN",
    "ENSEMBLES",
    "SHARED_STEP",
    "build_multimodel_repository",
    "initializations",
    "release",
    "variant_name",
]

BROKEN = "broken"
SHARED_STEP = "variant_shared_step"
ENSEMBLES = ("pair_a", "pair_b")

_MODEL_PY = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

OFFSET = {offset}
BALLAST_MB = {ballast_mb}


class TritonPythonModel:
    def initialize(self, args):
        self.folder = os.path.join(args["model_repository"])
        if {broken}:
            raise RuntimeError("this model is broken on purpose")
        # Touched pages, so the stub's resident set really holds them.
        self.ballast = np.ones(BALLAST_MB * 1024 * 1024 // 8, dtype=np.float64)
        with open(os.path.join(self.folder, "initialized.txt"), "a") as log:
            log.write("1\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            value = int(x.reshape(-1)[0])
            if value <= -1000:  # held until the test releases it (bounded, so a failed test frees it too)
                release = os.path.join(self.folder, f"release{{-value}}")
                deadline = time.monotonic() + 120
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
            out = pb_utils.Tensor("Y", (x + OFFSET).astype(np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def variant_name(index: int) -> str:
    return f"variant_{index}"


def _python_model(
    root: Path, name: str, offset: int, ballast_mb: int, broken: bool = False
) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(
        _MODEL_PY.format(offset=offset, ballast_mb=ballast_mb, broken=broken)
    )
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    config.input.add(name="X", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="Y", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))


def _ensemble(root: Path, name: str, step: str) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    config = mc.ModelConfig(name=name, platform="ensemble", max_batch_size=0)
    config.input.add(name="X", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="Y", data_type=mc.TYPE_INT32, dims=[1])
    item = config.ensemble_scheduling.step.add(model_name=step, model_version=-1)
    item.input_map["X"] = "X"
    item.output_map["Y"] = "Y"
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))


def build_multimodel_repository(root: Path, variants: int = 4, ballast_mb: int = 96) -> Path:
    """Write ``variants`` variant models, ``broken``, and two ensembles over one shared step.

    Args:
        root: an empty (or missing) directory.
        variants: how many ``variant_<i>`` models.
        ballast_mb: MiB each variant holds while loaded.

    Returns:
        ``root``.
    """
    for index in range(variants):
        _python_model(root, variant_name(index), index, ballast_mb)
    _python_model(root, BROKEN, 0, 0, broken=True)
    _python_model(root, SHARED_STEP, 100, ballast_mb)
    for name in ENSEMBLES:
        _ensemble(root, name, SHARED_STEP)
    return root


def initializations(root: Path, model: str) -> int:
    """How many times Triton initialised ``model`` (loaded it) so far."""
    log = root / model / "initialized.txt"
    return len(log.read_text().split()) if log.exists() else 0


def release(root: Path, model: str, hold: int) -> None:
    """Let the request sent to ``model`` with ``X = -hold`` finish."""
    (root / model / f"release{hold}").touch()
