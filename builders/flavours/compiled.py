"""The compiled flavours, for hosts without full TensorRT: ``torch.export``, then Inductor.

    spec -> FP16 channels_last (GPU) -> torch.export -> exported.pt2 | AOTInductor model.pt2
         -> loaded as the backend loads it -> parity vs PyTorch -> <source>_<kind>

The kinds, and how the entries are served, are described in :mod:`builders.compiled`. A compiled
entry has no input hash: it is compiled for the host it is built on, so every build makes a new
version.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from builders.errors import BuildError, ParityError
from builders.flavours.base import (
    Artifact,
    BuildRun,
    Loaded,
    WithoutVariants,
    load_reference,
    next_version,
    positional,
)
from builders.parity import ParityResult, compare
from builders.publication import Publication
from builders.report import BuildReport
from builders.spec import BatchingPolicy, ModelSpec
from builders.triton_config import ConfigOptions, model_config

__all__ = ["DEFAULT_MAX_BATCH", "FLAVOURS", "CompiledFlavour", "compiled_name"]

DEFAULT_MAX_BATCH = 256

#: the compiled kinds, each with the file it publishes (see builders.compiled)
FLAVOURS = {"inductor": "exported.pt2", "aoti": "model.pt2"}


def compiled_name(source: str, flavour: str = "inductor") -> str:
    return f"{source}_{flavour}"


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


@dataclass
class CompiledArtifact(Artifact):
    """The saved program or package, the module as the backend loads it, and the example input."""

    compiled: object = None
    example: object = None


@dataclass(frozen=True)
class CompiledFlavour(WithoutVariants):
    """``spec`` exported and compiled by Inductor for this host.

    Attributes:
        source: the registry name the entry is named after.
        kind: ``inductor`` (a ``torch.export`` program compiled at load) or ``aoti`` (AOTInductor).
        device: ``cuda`` (FP16 weights, channels_last) or ``cpu`` (FP32).
        name: the entry's name; ``<source>_<kind>`` by default.
        max_batch: the export's dynamic batch axis spans 1..``max_batch``.
        batching: the entry's dynamic batching; by default the spec's, up to ``max_batch``.

    Raises:
        BuildError: an unknown kind or device, AOTInductor asked for the CPU, or no CUDA device for
            ``device="cuda"``.
    """

    source: str
    kind: str = "inductor"
    device: str = "cuda"
    name: str | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    batching: BatchingPolicy | None = None

    exporting = "exporting and compiling"

    def __post_init__(self) -> None:
        import torch

        if self.kind not in FLAVOURS:
            raise BuildError(
                f"unknown flavour {self.kind!r}: expected one of {', '.join(FLAVOURS)}"
            )
        if self.device not in ("cuda", "cpu"):
            raise BuildError(f"unknown device {self.device!r}: expected cuda or cpu")
        if self.device == "cpu" and self.kind == "aoti":
            raise BuildError(
                "the aoti flavour is built for a GPU; on the CPU, build the inductor flavour"
            )
        if self.device == "cuda" and not torch.cuda.is_available():
            raise BuildError(
                f"the {self.kind} flavour for cuda is compiled on the GPU it serves on, "
                "and no CUDA device is visible here"
            )

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def entry_name(self, spec: ModelSpec) -> str:
        return self.name or compiled_name(self.source, self.kind)

    def digest(self, spec: ModelSpec) -> None:
        return None

    def load(self, spec: ModelSpec) -> Loaded:
        """The reference from the FP32 module, then the module converted as it is served."""
        import torch

        loaded = load_reference(spec)
        started = time.perf_counter()
        dtype = torch.float16 if self.gpu else torch.float32
        model = loaded.module.to(self.device).to(dtype).eval()
        if self.gpu:
            model = model.to(memory_format=torch.channels_last)
        loaded.module = model
        loaded.seconds += time.perf_counter() - started
        return loaded

    def export(
        self, spec: ModelSpec, loaded: Loaded, workdir: Path, run: BuildRun
    ) -> CompiledArtifact:
        import torch

        from serving.backends.pytorch.batch_runner import InputSpec, capture_sizes
        from serving.backends.pytorch.torch_module import TorchModule

        dtype = torch.float16 if self.gpu else torch.float32
        example = (
            torch.from_numpy(loaded.truth.feeds[spec.inputs[0].name]).to(self.device).to(dtype)
        )
        if self.gpu:
            example = example.contiguous(memory_format=torch.channels_last)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        batch = torch.export.Dim("batch", min=1, max=self.max_batch)
        # The sample set (88 photos and views) can outnumber max_batch: export and check in batches
        # it allows.
        chunks = example.split(self.max_batch)
        with torch.no_grad():
            exported = torch.export.export(
                loaded.module, (chunks[0],), dynamic_shapes=({0: batch},), strict=False
            )
        timings["export"] = time.perf_counter() - started
        filename = FLAVOURS[self.kind]
        artifact = workdir / filename
        started = time.perf_counter()
        if self.kind == "aoti":
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
        compiled = TorchModule(
            str(artifact), torch.device(self.device), dtype, self.gpu, [torch.float32]
        )
        with torch.inference_mode():
            outs = [compiled(chunk)[0] for chunk in chunks]
        # Every batch size the backend prepares, so their compiles are in the cache when it loads.
        compiled.warm([InputSpec(tuple(example.shape[1:]), dtype)], capture_sizes(self.max_batch))
        timings["compile"] = time.perf_counter() - started
        return CompiledArtifact(
            files={filename: artifact},
            outputs=[torch.cat(outs).float().cpu().numpy()],
            timings=timings,
            compiled=compiled,
            example=example,
        )

    def verify(
        self, spec: ModelSpec, loaded: Loaded, artifact: CompiledArtifact
    ) -> dict[str, ParityResult]:
        parity = compare(
            loaded.truth.reference[0],
            artifact.outputs[0],
            classes=spec.outputs[0].name == spec.class_output,
        )
        # FP16 on the GPU: the FP16 variant's tolerance; FP32: the export's own
        tolerance = spec.variant_tolerance("fp16") if self.gpu else spec.tolerance
        if parity.failures(tolerance):
            raise ParityError(
                f"{self.entry_name(spec)}: the {self.kind} flavour is outside the "
                f"{'FP16' if self.gpu else 'FP32'} tolerance: "
                f"{'; '.join(parity.failures(tolerance))}"
            )
        return {spec.outputs[0].name: parity}

    def entry(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        artifact: CompiledArtifact,
        parity: Mapping[str, ParityResult],
        digest: str,
        run: BuildRun,
    ) -> Publication:
        import torch

        name, gpu, max_batch = self.entry_name(spec), self.gpu, self.max_batch
        example = artifact.example
        probe = torch.randn(
            min(128 if gpu else 8, max_batch),
            *example.shape[1:],  # type: ignore[attr-defined]
            device=self.device,
            dtype=example.dtype,  # type: ignore[attr-defined]
        )
        if gpu:
            probe = probe.contiguous(memory_format=torch.channels_last)
        speed = {
            "eager": _images_per_s(loaded.module, probe),
            self.kind: _images_per_s(artifact.compiled, probe),
        }
        policy = self.batching or replace(
            spec.batching,
            max_batch_size=max_batch,
            preferred_batch_sizes=tuple(s for s in (32, 64, 128) if s <= max_batch),
        )
        config = model_config(
            name,
            inputs=positional(spec.inputs, "INPUT"),
            outputs=positional(spec.outputs, "OUTPUT"),
            batching=policy,
            options=ConfigOptions(
                platform="pytorch_libtorch",
                parameters=(
                    {"precision": "fp16", "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
                    if gpu
                    else {"precision": "fp32"}
                ),
                gpu=gpu,
            ),
        )
        config.default_model_filename = FLAVOURS[self.kind]
        if gpu:
            properties = torch.cuda.get_device_properties(torch.device(self.device))
            built_for = (
                f"{properties.name} (compute capability {properties.major}.{properties.minor})"
            )
        else:
            built_for = "the CPU"
        how = (
            "AOTInductor package"
            if self.kind == "aoti"
            else "torch.export program, torch.compile (Inductor) at load"
        )
        report = BuildReport(
            model=name,
            family=spec.family,
            version=next_version(run.repository, name),
            precision="fp16" if gpu else "fp32",
            weights=loaded.weights.__dict__,
            timings_s={"load": loaded.seconds, **artifact.timings},
            parity={out: result.as_dict() for out, result in parity.items()},
            notes=[
                f"{how} of {self.source}: {'FP16 weights, channels_last' if gpu else 'FP32'}, "
                f"batch 1..{max_batch}",
                f"built for {built_for}, torch {torch.__version__}",
                "in-process images/s at batch {}: eager {:,.0f}, {} {:,.0f}".format(
                    probe.shape[0], speed["eager"], self.kind, speed[self.kind]
                ),
            ],
        )
        return Publication(report, config, artifact.files)
