"""The TensorRT flavour installed here, the GPU it builds for, and what it says when a build fails,
and the build steps that talk to TensorRT's own API (parsing, the timing cache).

:mod:`builders.engine` builds through whichever flavour :func:`load_tensorrt` finds: full TensorRT
(``import tensorrt``, on a GPU host, for the local GPU's compute capability) or TensorRT for RTX
(``import tensorrt_rtx``, ahead of time, for a chosen compute capability). Neither importing raises
:class:`EngineUnavailable`; nothing is faked.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from builders.errors import BuildError, EngineBuildError

__all__ = [
    "EngineUnavailable",
    "TensorRT",
    "build_log",
    "load_tensorrt",
    "load_timing_cache",
    "local_compute_capability",
    "parse_onnx",
    "parser_errors",
    "rtx_capability",
    "save_timing_cache",
]


class EngineUnavailable(BuildError):
    """No TensorRT flavour is installed here; engines are skipped, never faked."""


@dataclass(frozen=True)
class TensorRT:
    """The TensorRT flavour that imported: its module, name and version."""

    module: ModuleType
    flavour: str  # "tensorrt" or "tensorrt-rtx"
    version: str


def load_tensorrt(prefer: str | None = None) -> TensorRT:
    """The installed TensorRT flavour: full TensorRT first, then TensorRT for RTX.

    Args:
        prefer: ``"tensorrt"`` or ``"tensorrt-rtx"`` to try only that flavour.

    Raises:
        EngineUnavailable: neither imports.
    """
    candidates = [("tensorrt", "tensorrt"), ("tensorrt-rtx", "tensorrt_rtx")]
    if prefer is not None:
        candidates = [c for c in candidates if c[0] == prefer]
    problems = []
    for flavour, module_name in candidates:
        try:
            module = __import__(module_name)
            version = str(module.__version__)
        except Exception as exc:  # ImportError, or a stub/broken install failing at import
            problems.append(f"{module_name}: {exc}")
            continue
        return TensorRT(module=module, flavour=flavour, version=version)
    raise EngineUnavailable(
        "TensorRT engines skipped: neither full TensorRT (`import tensorrt`, on a GPU host) nor "
        "TensorRT for RTX (`pip install tensorrt-rtx`) is installed (" + "; ".join(problems) + ")"
    )


def local_compute_capability() -> str:
    """The first local GPU's compute capability, e.g. "8.9" (full TensorRT builds for this GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.split()
            if out:
                return out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}.{minor}"
    except ImportError:
        pass
    raise EngineUnavailable(
        "full TensorRT is installed but no GPU is visible (nvidia-smi / CUDA) to build for"
    )


def rtx_capability(trt: ModuleType, capability: str) -> Any:
    member = "SM" + capability.replace(".", "")
    try:
        return getattr(trt.ComputeCapability, member)
    except AttributeError:
        known = [
            m[2:-1] + "." + m[-1] for m in trt.ComputeCapability.__members__ if m.startswith("SM")
        ]
        raise EngineBuildError(
            f"TensorRT for RTX cannot target compute capability {capability}; it builds for "
            f"{', '.join(known)}"
        ) from None


class BuildLog:
    """Keeps TensorRT's warnings and errors so a failed build can name them.

    TensorRT keeps the first logger a process gives it and ignores later ones, so there is one per
    TensorRT module (:func:`build_log`), cleared at the start of each build.
    """

    def __init__(self, trt: ModuleType) -> None:
        outer = self
        self.messages: list[str] = []

        class Logger(trt.ILogger):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)

            def log(self, severity: Any, msg: str) -> None:
                if severity <= trt.ILogger.Severity.WARNING:
                    outer.messages.append(f"{severity.name}: {msg}")

        self.logger = Logger()

    def errors(self) -> list[str]:
        return [m for m in self.messages if not m.startswith("WARNING")]


@functools.cache
def build_log(trt: ModuleType) -> BuildLog:
    return BuildLog(trt)


def parser_errors(parser: Any) -> list[str]:
    messages = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        code = getattr(error.code(), "name", str(error.code()))
        where = (
            f" at node {error.node()} '{error.node_name()}' (op {error.node_operator()})"
            if error.node() >= 0
            else ""
        )
        messages.append(f"{code}{where}: {error.desc()} [{error.func()}]")
    return messages


def parse_onnx(tensorrt: TensorRT, builder: Any, log: Any, onnx: Path) -> tuple[Any, Any]:
    """The strongly typed network of ``onnx``, and the parser that holds its weights."""
    trt = tensorrt.module
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log.logger)
    if not parser.parse_from_file(str(onnx)):
        problems = parser_errors(parser) or log.errors() or ["no detail given"]
        raise EngineBuildError(
            f"TensorRT ({tensorrt.flavour} {tensorrt.version}) cannot parse {onnx.name}: "
            + "; ".join(problems)
        )
    if network.num_outputs == 0:
        raise EngineBuildError(
            f"TensorRT ({tensorrt.flavour} {tensorrt.version}) parsed {onnx.name} "
            "to a network without outputs"
        )
    return network, parser


def load_timing_cache(config: Any, timing_cache: Path | None) -> None:
    """Start the build from ``timing_cache``'s tactic timings, where the file exists."""
    cache_bytes = (
        timing_cache.read_bytes() if timing_cache is not None and timing_cache.is_file() else b""
    )
    cache = config.create_timing_cache(cache_bytes)
    # A cache from another TensorRT build or device is ignored rather than failing the build.
    config.set_timing_cache(cache, True)


def save_timing_cache(config: Any, timing_cache: Path) -> None:
    """Keep the build's tactic timings in ``timing_cache`` for the next build."""
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    updated = config.get_timing_cache()
    if updated is not None:
        tmp = timing_cache.with_name(timing_cache.name + f".{os.getpid()}.tmp")
        tmp.write_bytes(memoryview(updated.serialize()))
        os.replace(tmp, timing_cache)  # atomic: a concurrent build reads the old or the new cache
