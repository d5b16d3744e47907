"""The TorchScript flavour of a PyTorch model: a ``pytorch_libtorch`` entry ``<model>_torchscript``.

    spec -> torch.jit.trace -> parity vs the eager module -> <model>_torchscript (model.pt)

Built like every artifact: its inputs are hashed (the spec's files, this module, the serving options),
an unchanged entry is not rebuilt, the trace is checked against the eager module on the spec's real
sample inputs, and a build report lies beside ``model.pt``. Tensor names follow libtorch's positional
convention (``INPUT__0`` ..., ``OUTPUT__0`` ...), which both the NGC container's native libtorch
backend and the Python-based ``pytorch`` backend (``serving/backends/pytorch``) accept as they are.

A trace records the device it ran on wherever the model names one (transformers' attention masks
call ``torch.arange(..., device=mask.device)``): such a graph, traced on the CPU, would build its
masks on the CPU beside CUDA activations. An entry served on CUDA whose CPU trace pins a device is
traced again on the GPU (its build must then run on a GPU host); one that pins none is traced on the
CPU and runs anywhere.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builders.errors import BuildError
from builders.flavours.base import (
    Artifact,
    BuildRun,
    Loaded,
    WithoutVariants,
    checked_parity,
    load_reference,
    next_version,
    positional,
)
from builders.hashing import inputs_hash
from builders.parity import ParityResult
from builders.publication import Publication
from builders.report import BuildReport, file_sha256
from builders.spec import BatchingPolicy, ModelSpec
from builders.triton_config import ConfigOptions, model_config

__all__ = [
    "TorchScriptFlavour",
    "TorchScriptOptions",
    "pinned_devices",
    "torchscript_name",
    "trace_for_device",
]


def torchscript_name(source: str) -> str:
    return f"{source}_torchscript"


@dataclass(frozen=True)
class TorchScriptOptions:
    """How the entry is served.

    Attributes:
        gpu: instance group ``KIND_GPU`` (FP16 on CUDA in our backend) instead of ``KIND_CPU``.
        precision: ``fp16`` or ``fp32``: what the backend computes in on a GPU (CPU is always FP32).
        device: the backend's ``device`` parameter: ``auto`` follows the instance kind, ``cuda`` runs
            a ``KIND_CPU`` instance on the GPU. On the embedded server use ``gpu=False,
            device="cuda"``: its Python backend answered ``KIND_GPU`` instances with empty output
            buffers on the H200 box (``binary_data_size: 0``), while a CPU instance that computes on
            CUDA itself returns correct tensors. The NGC native backend reads only the instance kind.
            A ``KIND_GPU`` entry also lets inputs that arrive in GPU memory (CUDA shared memory) stay
            there (``FORCE_CPU_ONLY_INPUT_TENSORS: no``).
        name: the entry's name; ``<source>_torchscript`` by default.
        batching: the entry's dynamic batching; the spec's when ``None`` (a GPU takes larger batches).
    """

    gpu: bool = False
    precision: str = "fp16"
    device: str = "auto"
    name: str | None = None
    batching: BatchingPolicy | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp16", "fp32"):
            raise BuildError(f"TorchScript precision must be fp16 or fp32, not {self.precision!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise BuildError(f"TorchScript device must be auto, cpu or cuda, not {self.device!r}")


def pinned_devices(traced: object) -> set[str]:
    """The devices a traced module's graph names as constants (``{"cpu"}``, ``{"cuda:0"}``, or none)."""
    graph = traced.inlined_graph  # type: ignore[attr-defined]
    return {
        str(node.output().toIValue())
        for node in graph.nodes()
        if node.kind() == "prim::Constant" and node.output().type().kind() == "DeviceObjType"
    }


def _runs_on_cuda(options: TorchScriptOptions) -> bool:
    return options.device == "cuda" or (options.device == "auto" and options.gpu)


def trace_for_device(
    module: object, args: tuple[object, ...], options: TorchScriptOptions, name: str
) -> tuple[object, tuple[object, ...]]:
    """The traced module and the inputs it takes (on the CUDA device when its graph must run there)."""
    import torch

    with torch.no_grad():
        traced = torch.jit.trace(module, args, check_trace=False)
    pinned = pinned_devices(traced)
    if not pinned or not _runs_on_cuda(options):
        return traced, args
    if not torch.cuda.is_available():
        raise BuildError(
            f"{name}: the trace pins device {sorted(pinned)} (the model creates tensors on its input's "
            "device), so an entry served on CUDA must be traced on a GPU, and none is visible here"
        )
    device = torch.device("cuda")
    module.to(device)  # type: ignore[attr-defined]
    args = tuple(a.to(device) for a in args)  # type: ignore[attr-defined]
    with torch.no_grad():
        traced = torch.jit.trace(module, args, check_trace=False)
    return traced, args


@dataclass
class TracedArtifact(Artifact):
    """The saved trace (``model.pt``) and the traced module, for the notes on its pinned devices."""

    traced: object = None


@dataclass(frozen=True)
class TorchScriptFlavour(WithoutVariants):
    """``spec`` traced and served by libtorch, as ``options`` say."""

    options: TorchScriptOptions = field(default_factory=TorchScriptOptions)
    source: str = ""

    exporting = "tracing TorchScript"

    def entry_name(self, spec: ModelSpec) -> str:
        return self.options.name or torchscript_name(self.source or spec.name)

    def digest(self, spec: ModelSpec) -> str:
        digest = hashlib.sha256()
        for part in (inputs_hash(spec), file_sha256(Path(__file__)), repr(self.options)):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def load(self, spec: ModelSpec) -> Loaded:
        return load_reference(spec)

    def export(
        self, spec: ModelSpec, loaded: Loaded, workdir: Path, run: BuildRun
    ) -> TracedArtifact:
        import torch

        started = time.perf_counter()
        # Not frozen: freezing folds weights into graph constants, which ``.half()`` in the backend
        # could then no longer convert.
        traced, args = trace_for_device(
            loaded.module,
            tuple(torch.from_numpy(loaded.truth.feeds[t.name]) for t in spec.inputs),
            self.options,
            self.entry_name(spec),
        )
        with torch.no_grad():
            out = traced(*args)  # type: ignore[operator]
        outs = out if isinstance(out, tuple | list) else (out,)
        path = workdir / "model.pt"
        torch.jit.save(traced, str(path))
        return TracedArtifact(
            files={"model.pt": path},
            outputs=[o.detach().cpu().numpy() for o in outs],
            timings={"trace": time.perf_counter() - started},
            traced=traced,
        )

    def verify(
        self, spec: ModelSpec, loaded: Loaded, artifact: TracedArtifact
    ) -> dict[str, ParityResult]:
        return checked_parity(
            spec,
            loaded.truth.reference,
            artifact.outputs,
            f"{self.entry_name(spec)}: TorchScript trace",
        )

    def entry(
        self,
        spec: ModelSpec,
        loaded: Loaded,
        artifact: TracedArtifact,
        parity: Mapping[str, ParityResult],
        digest: str,
        run: BuildRun,
    ) -> Publication:
        options, name = self.options, self.entry_name(spec)
        inputs, outputs = positional(spec.inputs, "INPUT"), positional(spec.outputs, "OUTPUT")
        config = model_config(
            name,
            inputs=inputs,
            outputs=outputs,
            batching=options.batching or spec.batching,
            options=ConfigOptions(
                platform="pytorch_libtorch",
                parameters={
                    "precision": options.precision,
                    "intra_op_thread_count": "0",
                    "device": options.device,
                    **({"FORCE_CPU_ONLY_INPUT_TENSORS": "no"} if options.gpu else {}),
                },
                gpu=options.gpu,
            ),
        )
        config.default_model_filename = "model.pt"
        pinned = pinned_devices(artifact.traced)
        report = BuildReport(
            model=name,
            family=spec.family,
            version=next_version(run.repository, name),
            precision=options.precision if options.gpu or options.device == "cuda" else "fp32",
            inputs_hash=digest,
            weights=loaded.weights.__dict__,
            # the trace's time as it always was: from loading the module to its checked outputs
            timings_s={"trace": loaded.seconds + artifact.timings["trace"]},
            parity={n: r.as_dict() for n, r in parity.items()},
            notes=[
                f"TorchScript trace of {self.source or spec.name}; inputs {[t.name for t in inputs]}, "
                f"outputs {[t.name for t in outputs]}; "
                f"parity vs the eager module on {len(loaded.truth.reference[0])} real samples"
            ]
            + (
                [f"the graph pins device {sorted(pinned)}: load it on that device"]
                if pinned
                else []
            ),
        )
        return Publication(report, config, artifact.files)
