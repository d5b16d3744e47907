"""Publish a TorchScript (``pytorch_libtorch``) twin of an ONNX classifier entry, for the GPU path.

    python -m loadtest.torchscript --repository model_repository --gpu

The entry ``<spec>_torchscript`` holds ``model.pt`` traced from the spec's PyTorch module and a
``config.pbtxt`` written through Triton's ``ModelConfig`` schema with ``platform:
"pytorch_libtorch"``. Tensor names follow libtorch's positional convention (``INPUT__0`` ...,
``OUTPUT__0`` ...), which both the NGC container's native libtorch backend and our Python-based
``pytorch`` backend (serving/backends/pytorch/model.py) accept without extra configuration. The
trace is checked against the eager module on the spec's real sample inputs before it is published.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from builders import repository as repo
from builders.errors import ParityError
from builders.export import torch_reference
from builders.parity import compare
from builders.registry import get_spec
from builders.report import BuildReport
from builders.spec import ModelSpec, TensorSpec
from builders.triton_config import model_config

__all__ = ["DEFAULT_SOURCE", "torchscript_name", "publish_torchscript", "main"]

DEFAULT_SOURCE = "efficientnet_lite0"


def torchscript_name(source: str) -> str:
    return f"{source}_torchscript"


def _positional(tensors: Sequence[TensorSpec], prefix: str) -> list[TensorSpec]:
    return [replace(t, name=f"{prefix}__{i}") for i, t in enumerate(tensors)]


def publish_torchscript(
    repository: Path,
    source: str = DEFAULT_SOURCE,
    *,
    gpu: bool = False,
    precision: str = "fp16",
    name: str | None = None,
    device: str = "auto",
) -> Path:
    """Trace ``source``'s module, check it, and publish it as a ``pytorch_libtorch`` entry.

    Args:
        repository: the Triton model repository to publish into.
        source: a registry name whose spec is a :class:`ModelSpec` (a PyTorch model).
        gpu: instance group ``KIND_GPU`` (FP16 on CUDA in our backend) instead of ``KIND_CPU``.
        precision: ``fp16`` or ``fp32``: what the backend computes in on a GPU (CPU is always FP32).
        name: the entry's name; ``<source>_torchscript`` by default.
        device: the backend's ``device`` parameter: ``auto`` follows the instance kind, ``cuda``
            runs a ``KIND_CPU`` instance on the GPU. On the embedded server use ``gpu=False,
            device="cuda"``: its Python backend answered ``KIND_GPU`` instances with empty output
            buffers on the H200 box (``binary_data_size: 0``), while a CPU instance that computes on
            CUDA itself returns correct tensors. The NGC native backend reads only the instance kind.

    Returns:
        The published version folder.

    Raises:
        ParityError: the traced module disagrees with the eager one beyond the spec's tolerance.
    """
    import torch

    spec = get_spec(source)
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"{source} is not a PyTorch model spec")
    name = name or torchscript_name(source)
    started = time.perf_counter()
    module, weights = spec.load()
    feeds = spec.sample_inputs()
    reference = torch_reference(module, spec, feeds)
    args = tuple(torch.from_numpy(feeds[t.name]) for t in spec.inputs)
    # Not frozen: freezing folds weights into graph constants, which ``.half()`` in the backend
    # could then no longer convert.
    with torch.no_grad():
        traced = torch.jit.trace(module, args, check_trace=False)
        out = traced(*args)
    outs = out if isinstance(out, tuple | list) else (out,)
    candidate = [o.detach().numpy() for o in outs]
    parity = {
        o.name: compare(ref, cand, classes=o.name == spec.class_output)
        for o, ref, cand in zip(spec.outputs, reference, candidate, strict=True)
    }
    failures = [f"{n}: {p}" for n, result in parity.items() for p in result.failures(spec.tolerance)]
    if failures:
        raise ParityError(f"{name}: TorchScript trace is outside tolerance: " + "; ".join(failures))

    inputs, outputs = _positional(spec.inputs, "INPUT"), _positional(spec.outputs, "OUTPUT")
    config = model_config(
        name,
        platform="pytorch_libtorch",
        inputs=inputs,
        outputs=outputs,
        batching=spec.batching,
        parameters={"precision": precision, "intra_op_thread_count": "0", "device": device},
        gpu=gpu,
    )
    config.default_model_filename = "model.pt"
    version = (repo.latest_version(repository, name) or 0) + 1
    report = BuildReport(
        model=name, family=spec.family, version=version, precision=precision if gpu else "fp32",
        weights=weights.__dict__, timings_s={"trace": time.perf_counter() - started},
        parity={n: r.as_dict() for n, r in parity.items()},
        notes=[f"TorchScript trace of {source}; inputs {[t.name for t in inputs]}, outputs {[t.name for t in outputs]}"],
    )
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-") as tmp:
        path = Path(tmp) / "model.pt"
        torch.jit.save(traced, str(path))
        return repo.publish(repository, config, {"model.pt": path}, report)


def sample_reference(source: str = DEFAULT_SOURCE) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, eager PyTorch outputs) of ``source`` on its real sample images, for checks."""
    spec = get_spec(source)
    assert isinstance(spec, ModelSpec)
    module, _ = spec.load()
    feeds = spec.sample_inputs()
    return feeds[spec.inputs[0].name], torch_reference(module, spec, feeds)[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.torchscript", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    parser.add_argument("--name", default=None)
    parser.add_argument("--gpu", action="store_true", help="instance group KIND_GPU")
    parser.add_argument("--precision", choices=["fp16", "fp32"], default="fp16")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="backend parameter: auto follows the instance kind; cuda computes on the GPU from a CPU instance")
    args = parser.parse_args(argv)
    print(publish_torchscript(args.repository, args.source, gpu=args.gpu, precision=args.precision, name=args.name,
                              device=args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
