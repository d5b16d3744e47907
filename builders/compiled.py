"""A compiled flavour for GPU hosts without full TensorRT: ``torch.export`` + AOTInductor.

    python -m builders.compiled --repository model_repository [--source efficientnet_lite0]

The spec's module is converted as the GPU serves it (FP16 weights, channels_last), exported with a
dynamic batch axis (1..``max_batch``) and compiled ahead of time by AOTInductor into one
``model.pt2`` package (generated Triton and C++ kernels for the GPU it is built on, weights inside).
Like every artifact it is checked against the FP32 PyTorch module on the spec's real sample inputs
(the FP16 variant's tolerance) and published with a build report: parity, compile and export times,
the in-process throughput of the package beside the eager module it replaces, GPU and versions.

The entry (``<source>_aoti``, ``platform: "pytorch_libtorch"``, ``default_model_filename:
"model.pt2"``) is served by the platform's Python-based ``pytorch`` backend, which captures the
package's calls into CUDA graphs like a TorchScript module's. The NGC container's native libtorch
backend does not load ``.pt2`` packages: on NGC, serve the TorchScript entry (or a TensorRT engine).
Packages are tied to the GPU architecture and the torch version they were compiled with, so build
on the serving host (or an identical one).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from builders import repository as repo
from builders.errors import BuildError, ParityError
from builders.export import torch_reference
from builders.parity import compare
from builders.registry import get_spec
from builders.report import BuildReport
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec
from builders.triton_config import model_config

__all__ = ["DEFAULT_MAX_BATCH", "compiled_name", "main", "publish_compiled"]

DEFAULT_MAX_BATCH = 256


def compiled_name(source: str) -> str:
    return f"{source}_aoti"


def _positional(tensors: Sequence[TensorSpec], prefix: str) -> list[TensorSpec]:
    return [replace(t, name=f"{prefix}__{i}") for i, t in enumerate(tensors)]


def _images_per_s(fn: object, x: object, seconds: float = 1.0) -> float:
    import torch

    with torch.inference_mode():
        for _ in range(3):
            fn(x)  # type: ignore[operator]
        torch.cuda.synchronize()
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            fn(x)  # type: ignore[operator]
            runs += 1
        torch.cuda.synchronize()
        return runs * int(x.shape[0]) / (time.perf_counter() - started)  # type: ignore[attr-defined]


def publish_compiled(repository: Path, source: str = "efficientnet_lite0", *, name: str | None = None,
                     max_batch: int = DEFAULT_MAX_BATCH, batching: BatchingPolicy | None = None) -> Path:
    """Export, compile, check and publish ``source`` as an AOTInductor entry for this GPU.

    Raises:
        BuildError: no CUDA device here (the package is compiled for the GPU it is built on).
        ParityError: the compiled package disagrees with PyTorch beyond the FP16 tolerance.
    """
    import torch

    if not torch.cuda.is_available():
        raise BuildError("AOTInductor compiles for the GPU it is built on, and no CUDA device is visible here")
    spec = get_spec(source)
    if not isinstance(spec, ModelSpec) or len(spec.inputs) != 1:
        raise BuildError(f"{source} is not a single-input PyTorch model spec")
    name = name or compiled_name(source)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    module, weights = spec.load()
    feeds = spec.sample_inputs()
    reference = torch_reference(module, spec, feeds)
    device = torch.device("cuda")
    model = module.to(device).half().to(memory_format=torch.channels_last).eval()  # type: ignore[attr-defined, call-overload]
    example = torch.from_numpy(feeds[spec.inputs[0].name]).to(device).half().contiguous(memory_format=torch.channels_last)
    timings["load"] = time.perf_counter() - started

    started = time.perf_counter()
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    # The sample set (88 photos and views) can outnumber max_batch: export and check in batches it allows.
    chunks = example.split(max_batch)
    with torch.no_grad():
        exported = torch.export.export(model, (chunks[0],), dynamic_shapes=({0: batch},), strict=False)
    timings["export"] = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-") as tmp:
        started = time.perf_counter()
        package = torch._inductor.aoti_compile_and_package(exported, package_path=str(Path(tmp) / "model.pt2"))
        timings["compile"] = time.perf_counter() - started
        compiled = torch._inductor.aoti_load_package(package)
        with torch.inference_mode():
            outs = [compiled(chunk.contiguous(memory_format=torch.channels_last)) for chunk in chunks]
        candidate = torch.cat([(o[0] if isinstance(o, tuple | list) else o).float() for o in outs]).cpu().numpy()
        parity = compare(reference[0], candidate, classes=spec.outputs[0].name == spec.class_output)
        tolerance = spec.variant_tolerance("fp16")
        if parity.failures(tolerance):
            raise ParityError(f"{name}: AOTInductor package is outside the FP16 tolerance: {'; '.join(parity.failures(tolerance))}")
        probe = torch.randn(min(128, max_batch), *example.shape[1:], device=device, dtype=torch.float16)
        probe = probe.contiguous(memory_format=torch.channels_last)
        speed = {"eager_fp16_channels_last": _images_per_s(model, probe), "aoti": _images_per_s(compiled, probe)}

        inputs, outputs = _positional(spec.inputs, "INPUT"), _positional(spec.outputs, "OUTPUT")
        policy = batching or replace(spec.batching, max_batch_size=max_batch,
                                     preferred_batch_sizes=tuple(s for s in (32, 64, 128) if s <= max_batch))
        config = model_config(name, platform="pytorch_libtorch", inputs=inputs, outputs=outputs, batching=policy,
                              parameters={"precision": "fp16", "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}, gpu=True)
        config.default_model_filename = "model.pt2"
        properties = torch.cuda.get_device_properties(device)
        report = BuildReport(
            model=name, family=spec.family, version=(repo.latest_version(repository, name) or 0) + 1, precision="fp16",
            weights=weights.__dict__, timings_s=timings, parity={spec.outputs[0].name: parity.as_dict()},
            notes=[
                f"torch.export + AOTInductor of {source}: FP16 weights, channels_last, batch 1..{max_batch}",
                f"built for {properties.name} (compute capability {properties.major}.{properties.minor}), torch {torch.__version__}",
                "in-process images/s at batch {}: eager FP16 channels_last {:,.0f}, AOTInductor {:,.0f}".format(
                    probe.shape[0], speed["eager_fp16_channels_last"], speed["aoti"]),
            ],
        )
        return repo.publish(repository, config, {"model.pt2": Path(package)}, report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builders.compiled", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--source", default="efficientnet_lite0")
    parser.add_argument("--name", default=None)
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    args = parser.parse_args(argv)
    print(publish_compiled(args.repository, args.source, name=args.name, max_batch=args.max_batch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
