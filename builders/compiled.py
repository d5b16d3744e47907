"""Compiled flavours for hosts without full TensorRT: ``torch.export``, then Inductor.

    python -m builders.compiled --repository model_repository [--source efficientnet_lite0]
                                [--flavour inductor|aoti] [--device cuda|cpu]

The spec's module is converted as it is served (on the GPU: FP16 weights, channels_last) and
exported with a dynamic batch axis (1..``max_batch``). Then, by flavour:

- ``inductor`` (the default): the exported program is saved as ``exported.pt2`` and compiled by
  ``torch.compile`` (Inductor) when the entry loads. Nothing compiled is stored in the entry, so it
  loads wherever the same torch runs; the compile (minutes cold) is kept in Inductor's cache, which
  this build fills on its own host by compiling the same graph for its parity check. On the H200
  host of ``benchmarks/h200`` this is the compiled flavour that runs: AOTInductor packages segfault
  there when they load.
- ``aoti``: AOTInductor compiles ahead of time into one ``model.pt2`` package (generated kernels
  for the GPU it is built on, weights inside); GPU only, tied to that GPU architecture and torch.

Like every artifact it is checked against the FP32 PyTorch module on the spec's real sample inputs
(the FP16 variant's tolerance on the GPU, the FP32 one on the CPU), loaded exactly as the backend
loads it (:class:`~serving.backends.pytorch.batch_runner.TorchModule`), and published with a build
report: parity, export and compile times, the in-process throughput beside the eager module it
replaces, device and versions.

The entry (``<source>_<flavour>``, ``platform: "pytorch_libtorch"``, ``default_model_filename``
the file above) is served by the platform's Python-based ``pytorch`` backend, which captures the
compiled calls into CUDA graphs like a TorchScript module's. The NGC container's native libtorch
backend loads neither file: on NGC, serve the TorchScript entry (or a TensorRT engine).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
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

__all__ = ["DEFAULT_MAX_BATCH", "FLAVOURS", "compiled_name", "main", "publish_compiled"]

DEFAULT_MAX_BATCH = 256


#: the flavours, each with the file it publishes (see the module's docstring)
FLAVOURS = {"inductor": "exported.pt2", "aoti": "model.pt2"}


def compiled_name(source: str, flavour: str = "inductor") -> str:
    return f"{source}_{flavour}"


def _positional(tensors: Sequence[TensorSpec], prefix: str) -> list[TensorSpec]:
    return [replace(t, name=f"{prefix}__{i}") for i, t in enumerate(tensors)]


def _images_per_s(fn: object, x: object, seconds: float = 1.0) -> float:
    import torch

    def synchronize() -> None:
        if x.is_cuda:  # type: ignore[attr-defined]
            torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(3):
            fn(x)  # type: ignore[operator]
        synchronize()
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            fn(x)  # type: ignore[operator]
            runs += 1
        synchronize()
        return runs * int(x.shape[0]) / (time.perf_counter() - started)  # type: ignore[attr-defined]


def publish_compiled(
    repository: Path,
    source: str = "efficientnet_lite0",
    *,
    flavour: str = "inductor",
    device: str = "cuda",
    name: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    batching: BatchingPolicy | None = None,
) -> Path:
    """Export, compile, check and publish ``source`` as a compiled entry for this host.

    Raises:
        BuildError: an unknown flavour or device, no CUDA device for ``device="cuda"``, or AOTInductor
            asked for the CPU (its packages are compiled for the GPU they are built on).
        ParityError: the compiled module disagrees with PyTorch beyond the variant's tolerance.
    """
    import torch

    from serving.backends.pytorch.batch_runner import InputSpec, TorchModule, capture_sizes

    if flavour not in FLAVOURS:
        raise BuildError(f"unknown flavour {flavour!r}: expected one of {', '.join(FLAVOURS)}")
    if device not in ("cuda", "cpu"):
        raise BuildError(f"unknown device {device!r}: expected cuda or cpu")
    if device == "cpu" and flavour == "aoti":
        raise BuildError(
            "the aoti flavour is built for a GPU; on the CPU, build the inductor flavour"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise BuildError(
            f"the {flavour} flavour for cuda is compiled on the GPU it serves on, and no CUDA device is visible here"
        )
    spec = get_spec(source)
    if not isinstance(spec, ModelSpec) or len(spec.inputs) != 1:
        raise BuildError(f"{source} is not a single-input PyTorch model spec")
    name = name or compiled_name(source, flavour)
    filename = FLAVOURS[flavour]
    gpu = device == "cuda"
    dtype = torch.float16 if gpu else torch.float32
    timings: dict[str, float] = {}
    started = time.perf_counter()
    module, weights = spec.load()
    feeds = spec.sample_inputs()
    reference = torch_reference(module, spec, feeds)
    model = module.to(device).to(dtype).eval()  # type: ignore[attr-defined]
    example = torch.from_numpy(feeds[spec.inputs[0].name]).to(device).to(dtype)
    if gpu:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        example = example.contiguous(memory_format=torch.channels_last)
    timings["load"] = time.perf_counter() - started

    started = time.perf_counter()
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    # The sample set (88 photos and views) can outnumber max_batch: export and check in batches it allows.
    chunks = example.split(max_batch)
    with torch.no_grad():
        exported = torch.export.export(
            model, (chunks[0],), dynamic_shapes=({0: batch},), strict=False
        )
    timings["export"] = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix=f"build-{name}-") as tmp:
        artifact = Path(tmp) / filename
        started = time.perf_counter()
        if flavour == "aoti":
            torch._inductor.aoti_compile_and_package(exported, package_path=str(artifact))
        else:
            with warnings.catch_warnings():
                # torch.export.save warns when the tensors of one storage group are all partial
                # views, which FP16 channels_last CUDA weights are (seen on the H200 host); what it
                # saved is checked below, on the file as the backend loads it.
                warnings.filterwarnings(
                    "ignore", message="No complete tensor found in the group", category=UserWarning
                )
                torch.export.save(exported, str(artifact))
        # Loaded as the backend loads it; the inductor flavour compiles in its first calls.
        compiled = TorchModule(str(artifact), torch.device(device), dtype, gpu, [torch.float32])
        with torch.inference_mode():
            outs = [compiled(chunk)[0] for chunk in chunks]
        # Every batch size the backend prepares, so their compiles are in the cache when it loads.
        compiled.warm([InputSpec(tuple(example.shape[1:]), dtype)], capture_sizes(max_batch))
        timings["compile"] = time.perf_counter() - started
        candidate = torch.cat(outs).float().cpu().numpy()
        parity = compare(reference[0], candidate, classes=spec.outputs[0].name == spec.class_output)
        tolerance = (
            spec.variant_tolerance("fp16") if gpu else spec.tolerance
        )  # FP32: the export's own
        if parity.failures(tolerance):
            raise ParityError(
                f"{name}: the {flavour} flavour is outside the {'FP16' if gpu else 'FP32'} tolerance: "
                f"{'; '.join(parity.failures(tolerance))}"
            )
        probe = torch.randn(
            min(128 if gpu else 8, max_batch), *example.shape[1:], device=device, dtype=dtype
        )
        if gpu:
            probe = probe.contiguous(memory_format=torch.channels_last)
        speed = {"eager": _images_per_s(model, probe), flavour: _images_per_s(compiled, probe)}

        inputs, outputs = _positional(spec.inputs, "INPUT"), _positional(spec.outputs, "OUTPUT")
        policy = batching or replace(
            spec.batching,
            max_batch_size=max_batch,
            preferred_batch_sizes=tuple(s for s in (32, 64, 128) if s <= max_batch),
        )
        parameters = (
            {"precision": "fp16", "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
            if gpu
            else {"precision": "fp32"}
        )
        config = model_config(
            name,
            platform="pytorch_libtorch",
            inputs=inputs,
            outputs=outputs,
            batching=policy,
            parameters=parameters,
            gpu=gpu,
        )
        config.default_model_filename = filename
        if gpu:
            properties = torch.cuda.get_device_properties(torch.device(device))
            built_for = (
                f"{properties.name} (compute capability {properties.major}.{properties.minor})"
            )
        else:
            built_for = "the CPU"
        how = (
            "AOTInductor package"
            if flavour == "aoti"
            else "torch.export program, torch.compile (Inductor) at load"
        )
        report = BuildReport(
            model=name,
            family=spec.family,
            version=(repo.latest_version(repository, name) or 0) + 1,
            precision="fp16" if gpu else "fp32",
            weights=weights.__dict__,
            timings_s=timings,
            parity={spec.outputs[0].name: parity.as_dict()},
            notes=[
                f"{how} of {source}: {'FP16 weights, channels_last' if gpu else 'FP32'}, batch 1..{max_batch}",
                f"built for {built_for}, torch {torch.__version__}",
                "in-process images/s at batch {}: eager {:,.0f}, {} {:,.0f}".format(
                    probe.shape[0], speed["eager"], flavour, speed[flavour]
                ),
            ],
        )
        return repo.publish(repository, config, {filename: artifact}, report)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.compiled",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument(
        "--repository", type=Path, required=True, help="the model repository to publish into"
    )
    parser.add_argument(
        "--source", default="efficientnet_lite0", help="the PyTorch model spec to compile"
    )
    parser.add_argument(
        "--flavour",
        choices=sorted(FLAVOURS),
        default="inductor",
        help="inductor: torch.export program compiled at load (default); aoti: AOTInductor package",
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="where the entry serves"
    )
    parser.add_argument(
        "--name", default=None, help="the entry's name (default <source>_<flavour>)"
    )
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    args = parser.parse_args(argv)
    print(
        publish_compiled(
            args.repository,
            args.source,
            flavour=args.flavour,
            device=args.device,
            name=args.name,
            max_batch=args.max_batch,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
