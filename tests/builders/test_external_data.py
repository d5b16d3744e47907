"""ONNX external data: a model whose weights live beside its graph is published whole and loads in Triton.

A real SD 1.5 UNet in FP32 (3.4 GB) cannot be one protobuf; the exporter then writes its tensors to
``model.onnx.data``. Here a small model is forced to external data (``onnx_external_data``), so the
same path runs in seconds: export, parity, the FP16 variant, staged publishing of every file with its
hash in the build report, and loading and answering in the real Triton.
"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from builders.export import onnx_files
from builders.pipeline import BuildOptions, build_specs
from builders.report import BuildReport, file_sha256
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec, WeightsInfo
from serving.launcher import TritonPorts, TritonServer

pytestmark = pytest.mark.integration


class ExternalMLP(ModelSpec):
    name = "external_mlp"
    family = "test"
    description = "a small MLP whose weights are forced into ONNX external data"
    inputs = (TensorSpec("x", "float32", (16,)),)
    outputs = (TensorSpec("y", "float32", (8,)),)
    batching = BatchingPolicy(max_batch_size=4)
    variants = ("fp16",)
    onnx_external_data = True

    def load(self):  # type: ignore[no-untyped-def]
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
        ).eval()
        return model, WeightsInfo(source="random-init", pretrained=False, note="test model")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("external") / "model_repository"
    build_specs([ExternalMLP()], BuildOptions(repository=root))
    return root


@pytest.mark.parametrize("name", ["external_mlp", "external_mlp_fp16"])
def test_every_file_is_published_and_hashed(repository: Path, name: str) -> None:
    version = repository / name / "1"
    assert sorted(p.name for p in version.iterdir()) == [
        "build_report.json",
        "model.onnx",
        "model.onnx.data",
    ]
    assert set(onnx_files(version / "model.onnx")) == {"model.onnx", "model.onnx.data"}
    report = BuildReport.read(version / "build_report.json")
    for published in ("model.onnx", "model.onnx.data"):
        entry = report.artifacts["model" if published == "model.onnx" else published]
        assert entry["sha256"] == file_sha256(version / published)
        assert entry["bytes"] == (version / published).stat().st_size
    # The graph itself holds no weights; the server can read the data whatever user it runs as.
    assert (version / "model.onnx.data").stat().st_size > (version / "model.onnx").stat().st_size
    assert (version / "model.onnx.data").stat().st_mode & stat.S_IROTH


def test_a_graph_without_its_data_is_refused(repository: Path, tmp_path: Path) -> None:
    import shutil

    lonely = tmp_path / "model.onnx"
    shutil.copy(repository / "external_mlp" / "1" / "model.onnx", lonely)
    with pytest.raises(FileNotFoundError, match="model.onnx.data"):
        onnx_files(lonely)


def test_triton_loads_and_answers_with_external_data(repository: Path) -> None:
    import torch

    spec = ExternalMLP()
    x = spec.sample_inputs()["x"]
    with torch.inference_mode():
        expected = spec.load()[0](torch.from_numpy(x)).numpy()
    with TritonServer(
        repository, models=["external_mlp", "external_mlp_fp16"], ports=TritonPorts.free()
    ) as server:
        with http.InferenceServerClient(server.http_url) as client:
            for name, tolerance in (("external_mlp", 1e-5), ("external_mlp_fp16", 1e-2)):
                tensor = http.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                y = client.infer(name, [tensor]).as_numpy("y")
                np.testing.assert_allclose(y, expected, atol=tolerance)
