"""The multimodel benchmark's GPU variants, checked on CPU: the configs are valid KIND_GPU
``pytorch_libtorch`` entries, the TorchScript files load and answer, weights differ per variant,
and ``--device gpu`` without CUDA stops with a message that says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from loadtest.multimodel import CLASSES, FEATURES
from loadtest.multimodel_gpu import STUB_STEPS, build_torchscript_variants
from loadtest.registry import run_named


def test_variants_are_gpu_torchscript_entries_with_their_own_weights(tmp_path: Path) -> None:
    names = build_torchscript_variants(
        tmp_path,
        ["classifier_v00", "classifier_v01"],
        seed=5,
        features=FEATURES,
        classes=CLASSES,
        hidden=32,
    )
    assert names == ["classifier_v00", "classifier_v01"]
    outputs = []
    for name in names:
        config = text_format.Parse((tmp_path / name / "config.pbtxt").read_text(), mc.ModelConfig())
        assert config.name == name and config.platform == "pytorch_libtorch"
        assert [g.kind for g in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU]
        assert [tuple(i.dims) for i in config.input] == [(FEATURES,)]
        assert [tuple(o.dims) for o in config.output] == [(CLASSES,)]
        module = torch.jit.load(str(tmp_path / name / "1" / "model.pt"), map_location="cpu")
        out = module(torch.ones(3, FEATURES))
        assert out.shape == (3, CLASSES)
        outputs.append(out)
    assert not torch.equal(outputs[0], outputs[1])


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message given where CUDA is missing"
)
def test_device_gpu_without_cuda_says_so(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        run_named(
            "multimodel",
            ["--device", "gpu", "--models", "2", "--budget-models", "1", "--out", str(tmp_path)],
        )


def test_gpu_metrics_are_published_often_only_when_asked(tmp_path: Path) -> None:
    from serving.launcher import TritonServer

    assert "--allow-gpu-metrics=false" in TritonServer(tmp_path, models=[]).command(tmp_path)
    command = TritonServer(tmp_path, models=[], gpu_metrics=True).command(tmp_path)
    assert "--allow-gpu-metrics=true" in command and "--metrics-interval-ms=100" in command


def test_the_stub_profile_imports_what_the_backend_has() -> None:
    """The stub-start profile runs only on the GPU host: here, every name it imports must exist."""
    import ast
    import importlib

    tree = ast.parse(STUB_STEPS)
    imported = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    ]
    assert imported, "the profile imports the backend's pieces"
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
