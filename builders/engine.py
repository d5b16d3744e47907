"""FP16 / Q/DQ ONNX -> TensorRT engine (``model.plan``) with its metadata (``engine.json``).

One code path for both TensorRT flavours:

- full TensorRT (``import tensorrt``), on a GPU host: the engine targets that GPU's compute capability;
- TensorRT for RTX (``import tensorrt_rtx``, PyPI ``tensorrt-rtx``): builds ahead of time, on a
  machine without a GPU, for a chosen compute capability (8.9, the RTX 4090, by default).

The network is strongly typed: precision comes from the graph (FP16 tensors, Q/DQ nodes), never
from builder flags. One optimization profile per input spans batch 1 .. ``max_batch_size`` (the
dynamic batcher can form a batch of exactly ``max_batch_size``, server#8141). A timing cache file is
loaded and saved so rebuilds reuse tactic timings. When neither flavour imports,
:class:`EngineUnavailable` says so; nothing is faked.

    meta = build_engine(Path("model_fp16.onnx"), out, EngineProfile(max_batch_size=32), "fp16",
                        EngineOptions(timing_cache=Path(".build/trt.cache")))

Engines are tied to the TensorRT version and the compute capability: :func:`check_engine` compares
``engine.json`` with this host; :mod:`builders.engine_target` decides whether a Triton server can load
an engine at all (only full TensorRT plans, of its TensorRT version, for its GPU).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builders.errors import BuildError, EngineBuildError
from builders.report import file_sha256

# Which flavour is installed and what GPU it targets live in builders.tensorrt_host; the names callers
# use are re-exported here (``__all__``), and the private alias keeps builders.variants' call working.
from builders.tensorrt_host import (
    EngineUnavailable,
    TensorRT,
    build_log,
    load_tensorrt,
    load_timing_cache,
    parse_onnx,
    rtx_capability,
    save_timing_cache,
)
from builders.tensorrt_host import local_compute_capability as _local_compute_capability

__all__ = [
    "DEFAULT_COMPUTE_CAPABILITY",
    "DEFAULT_OPTIMIZATION_LEVEL",
    "ENGINE_NAME",
    "METADATA_NAME",
    "EngineMetadata",
    "EngineMismatchError",
    "EngineOptions",
    "EngineProfile",
    "EngineUnavailable",
    "RUNTIME_RTX",
    "RUNTIME_TRITON",
    "TensorRT",
    "build_engine",
    "check_engine",
    "load_tensorrt",
    "read_metadata",
    "runtime_of",
]

ENGINE_NAME = "model.plan"
METADATA_NAME = "engine.json"
#: TensorRT for RTX target when none is given: the RTX 4090 (Ada, SM 8.9)
DEFAULT_COMPUTE_CAPABILITY = "8.9"
#: builder optimization level (0-5, TensorRT's default). Lower levels bound full TensorRT's tactic
#: search on a GPU host; TensorRT for RTX builds efficientnet_lite0 in ~0.4-1 s at any level on 2
#: CPU cores (it compiles kernels on the target GPU at first run instead).
DEFAULT_OPTIMIZATION_LEVEL = 3
_WORKSPACE_BYTES = 1 << 30
#: the runtime an engine needs, as engine.json labels it: Triton's tensorrt_plan backend loads only
#: plans of full TensorRT; TensorRT for RTX engines need the RTX runtime (builders.engine_target)
RUNTIME_TRITON = "triton-tensorrt_plan"
RUNTIME_RTX = "tensorrt-rtx-runtime"


def runtime_of(flavour: str) -> str:
    """The runtime an engine built by ``flavour`` runs under."""
    return RUNTIME_TRITON if flavour == "tensorrt" else RUNTIME_RTX


class EngineMismatchError(BuildError):
    """An engine was built for another TensorRT version or compute capability than this host's."""


@dataclass
class EngineMetadata:
    flavour: str
    tensorrt_version: str
    compute_capability: str
    precision: str
    input_hash: str  # sha256 of the ONNX the engine was built from
    max_batch_size: int
    build_seconds: float
    optimization_level: int
    profiles: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    engine_sha256: str = ""
    engine_bytes: int = 0
    onnx_file: str = ""
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    #: what runs it (:func:`runtime_of`); empty in metadata written before the label existed
    runtime: str = ""

    def write(self, directory: Path) -> Path:
        path = directory / METADATA_NAME
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path


def read_metadata(path: Path) -> EngineMetadata:
    """``engine.json`` (or the folder holding it) as :class:`EngineMetadata`."""
    if path.is_dir():
        path = path / METADATA_NAME
    return EngineMetadata(**json.loads(path.read_text(encoding="utf-8")))


def _check_onnx(path: Path) -> None:
    """A file the ONNX library cannot read is named as such before TensorRT sees it."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError and friends: the file is not a serialized ModelProto
        raise EngineBuildError(f"{path.name} is not a readable ONNX model: {exc}") from exc
    if not model.graph.output:
        raise EngineBuildError(
            f"{path.name} is not a usable ONNX model: its graph has no outputs "
            f"({path.stat().st_size} bytes; a truncated or foreign file?)"
        )


def _axis_ranges(
    name: str, dims: list[int], given: Sequence[Sequence[int]] | None, onnx_name: str
) -> tuple[list[int], list[int], list[int]]:
    """(min, opt, max) non-batch dims of one input: its fixed dims, or the ranges given for dynamic ones."""
    if given is None:
        if any(d == -1 for d in dims):
            raise EngineBuildError(
                f"input '{name}' of {onnx_name} has dynamic non-batch axes {[-1, *dims]}; "
                "an engine profile needs their (min, opt, max) sizes (spec.engine_axis_ranges)"
            )
        return dims, dims, dims
    if len(given) != 3 or any(len(g) != len(dims) for g in given):
        raise EngineBuildError(
            f"axis ranges for input '{name}' must be (min, opt, max) dims of rank {len(dims)}, "
            f"got {given}"
        )
    low, mid, high = (list(g) for g in given)
    for axis, d in enumerate(dims):
        if not (0 < low[axis] <= mid[axis] <= high[axis]) or (
            d != -1 and not low[axis] == mid[axis] == high[axis] == d
        ):
            raise EngineBuildError(
                f"axis {axis + 1} of input '{name}' ({d}) cannot take range "
                f"{low[axis]}..{mid[axis]}..{high[axis]}"
            )
    return low, mid, high


@dataclass(frozen=True)
class EngineProfile:
    """The shapes an engine is built for: one optimization profile per input.

    Attributes:
        max_batch_size: the profile's max batch (the Triton config's ``max_batch_size``).
        preferred_batch_size: the profile's ``opt`` batch (defaults to ``max_batch_size``).
        axis_ranges: input name -> (min dims, opt dims, max dims) without the batch axis, for inputs
            with dynamic non-batch axes (sequence length); fixed axes may repeat their size.
    """

    max_batch_size: int
    preferred_batch_size: int | None = None
    axis_ranges: Mapping[str, Sequence[Sequence[int]]] | None = None


@dataclass(frozen=True)
class EngineOptions:
    """How engines are built (``inferctl build --engines``).

    Attributes:
        timing_cache: file to load tactic timings from and save them to (created if missing).
        compute_capability: TensorRT for RTX target, e.g. "8.9"; full TensorRT always builds for the
            local GPU and refuses another value.
        optimization_level: builder optimization level 0-5 (bounds build time).
        flavour: force "tensorrt" or "tensorrt-rtx" (the installed one otherwise).
        triton_release: the NGC Triton release the repository is for (its TensorRT version decides
            which engines become entries, :mod:`builders.engine_target`); None: the platform's image.
    """

    timing_cache: Path | None = None
    compute_capability: str | None = None
    optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    flavour: str | None = None
    triton_release: str | None = None


def build_engine(
    onnx: Path,
    out_dir: Path,
    profile: EngineProfile,
    precision: str,
    options: EngineOptions = EngineOptions(),
    *,
    input_hash: str | None = None,
) -> EngineMetadata:
    """Build a strongly typed TensorRT engine from ``onnx`` into ``out_dir/model.plan`` + ``engine.json``.

    Args:
        profile: the shapes to build for.
        precision: what the graph holds ("fp16", "int8"); recorded, not enforced by flags.
        options: timing cache, target, optimization level, flavour.
        input_hash: the ONNX's sha256 (computed when not given).

    Returns:
        The engine's metadata, also written to ``out_dir/engine.json``.

    Raises:
        EngineUnavailable: no TensorRT flavour is installed.
        EngineBuildError: the ONNX is missing or cannot be parsed, or TensorRT could not build it;
            the message carries the parser's / builder's own errors.
    """
    if profile.max_batch_size < 1:
        raise EngineBuildError(
            f"TensorRT engines need a batch axis: max_batch_size is {profile.max_batch_size}"
        )
    if not onnx.is_file():
        raise EngineBuildError(f"ONNX file for the TensorRT engine not found: {onnx}")
    _check_onnx(onnx)
    tensorrt = load_tensorrt(options.flavour)
    capability = _target_capability(tensorrt, options.compute_capability)

    started = time.perf_counter()
    log = build_log(tensorrt.module)
    log.messages.clear()
    builder = tensorrt.module.Builder(log.logger)
    # The parser owns the weights the network refers to: it must live until the engine is built.
    network, _parser = parse_onnx(tensorrt, builder, log, onnx)
    config = _builder_config(tensorrt, builder, options.optimization_level, capability)
    profiles = _add_profile(builder, config, network, profile, onnx.name)
    load_timing_cache(config, options.timing_cache)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(
            f"TensorRT ({tensorrt.flavour} {tensorrt.version}) could not build {onnx.name}: "
            + ("; ".join(log.errors()) or "no detail given")
        )
    seconds = time.perf_counter() - started

    out_dir.mkdir(parents=True, exist_ok=True)
    plan = out_dir / ENGINE_NAME
    with open(plan, "wb") as handle:
        handle.write(memoryview(serialized))
    if options.timing_cache is not None:
        save_timing_cache(config, options.timing_cache)

    metadata = EngineMetadata(
        flavour=tensorrt.flavour,
        tensorrt_version=tensorrt.version,
        compute_capability=capability,
        precision=precision,
        input_hash=input_hash or file_sha256(onnx),
        max_batch_size=profile.max_batch_size,
        build_seconds=round(seconds, 3),
        optimization_level=options.optimization_level,
        profiles=profiles,
        engine_sha256=file_sha256(plan),
        engine_bytes=plan.stat().st_size,
        onnx_file=onnx.name,
        runtime=runtime_of(tensorrt.flavour),
    )
    metadata.write(out_dir)
    return metadata


def _target_capability(tensorrt: TensorRT, requested: str | None) -> str:
    """The compute capability the engine is built for: the local GPU's under full TensorRT."""
    if tensorrt.flavour == "tensorrt":
        local = _local_compute_capability()
        if requested not in (None, local):
            raise EngineBuildError(
                f"full TensorRT builds for the local GPU (compute capability {local}), "
                f"not {requested}; use TensorRT for RTX to build ahead of time"
            )
        return local
    return requested or DEFAULT_COMPUTE_CAPABILITY


def _builder_config(
    tensorrt: TensorRT, builder: Any, optimization_level: int, capability: str
) -> Any:
    trt = tensorrt.module
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, _WORKSPACE_BYTES)
    config.builder_optimization_level = optimization_level
    if tensorrt.flavour == "tensorrt-rtx":
        config.num_compute_capabilities = 1
        config.set_compute_capability(rtx_capability(trt, capability), 0)
    return config


def _add_profile(
    builder: Any, config: Any, network: Any, profile: EngineProfile, onnx_name: str
) -> dict[str, dict[str, list[int]]]:
    """One optimization profile over every input; returns its shapes by input, for ``engine.json``."""
    max_batch_size = profile.max_batch_size
    opt = min(max(profile.preferred_batch_size or max_batch_size, 1), max_batch_size)
    trt_profile = builder.create_optimization_profile()
    profiles: dict[str, dict[str, list[int]]] = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims = list(tensor.shape)
        if dims[0] != -1:
            raise EngineBuildError(
                f"input '{tensor.name}' of {onnx_name} has no dynamic batch axis: {dims}"
            )
        low, mid, high = _axis_ranges(
            tensor.name, dims[1:], (profile.axis_ranges or {}).get(tensor.name), onnx_name
        )
        shapes = {"min": [1, *low], "opt": [opt, *mid], "max": [max_batch_size, *high]}
        trt_profile.set_shape(tensor.name, shapes["min"], shapes["opt"], shapes["max"])
        profiles[tensor.name] = shapes
    config.add_optimization_profile(trt_profile)
    return profiles


def check_engine(
    metadata: EngineMetadata | Path,
    *,
    tensorrt_version: str | None = None,
    compute_capability: str | None = None,
    flavour: str | None = None,
    plan: Path | None = None,
) -> EngineMetadata:
    """Refuse an engine the serving host cannot run: another TensorRT version or compute capability.

    Args:
        metadata: the engine's metadata or its ``engine.json`` / folder.
        tensorrt_version, compute_capability, flavour: the serving host's; read from the installed
            TensorRT and the local GPU when not given.
        plan: when given, its sha256 must match the one recorded (a swapped or truncated plan).

    Raises:
        EngineMismatchError: naming each mismatch.
    """
    meta = metadata if isinstance(metadata, EngineMetadata) else read_metadata(metadata)
    if tensorrt_version is None or flavour is None:
        installed = load_tensorrt(meta.flavour)
        tensorrt_version = tensorrt_version or installed.version
        flavour = flavour or installed.flavour
    if compute_capability is None:
        compute_capability = _local_compute_capability()
    problems = []
    if flavour != meta.flavour:
        problems.append(f"built with {meta.flavour}, host runs {flavour}")
    if tensorrt_version != meta.tensorrt_version:
        problems.append(f"built with TensorRT {meta.tensorrt_version}, host has {tensorrt_version}")
    if compute_capability != meta.compute_capability:
        problems.append(
            f"built for compute capability {meta.compute_capability}, host GPU is {compute_capability}"
        )
    if plan is not None and meta.engine_sha256 and file_sha256(plan) != meta.engine_sha256:
        problems.append(f"{plan.name} does not match the sha256 recorded at build time")
    if problems:
        raise EngineMismatchError("engine cannot be served here: " + "; ".join(problems))
    return meta
