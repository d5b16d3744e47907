"""Which onnxruntime execution providers and session options a model instance asks for (the
``onnxruntime`` backend).

Apart from ``model.py`` so it can be read and tested without Triton; the launcher copies it beside
``model.py``. The config is the model config as Triton hands it to the backend (JSON, proto field
names), and it is read the way Triton's native onnxruntime backend reads it:
``optimization { execution_accelerators { gpu_execution_accelerator: [{ name: "tensorrt",
parameters { key: "precision_mode" value: "FP16" } }] } }``.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "Provider",
    "avoid_saturating_int8",
    "execution_providers",
    "int8_kernels_saturate",
    "session_options",
    "tensorrt_request",
]

#: onnxruntime's session option that runs a Q/DQ graph as float math instead of fused INT8 kernels
DISABLE_QDQ_FUSION = "session.disable_quant_qdq"
#: onnxruntime's session option for the intra-op pool's busy-waiting ("1" spins, "0" sleeps)
SPINNING = "session.intra_op.allow_spinning"
#: x86 CPU flags with an int8 dot product that accumulates in 32 bits
_VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


class _Tensor(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def dims(self) -> tuple[int, ...]: ...


Provider = str | tuple[str, dict[str, str]]


def tensorrt_request(config: Mapping[str, Any]) -> Mapping[str, str] | None:
    """The parameters of the config's ``tensorrt`` GPU execution accelerator, or None if it asks for none."""
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    for accelerator in accelerators.get("gpu_execution_accelerator", []):
        if accelerator.get("name") == "tensorrt":
            return dict(accelerator.get("parameters", {}))
    return None


def _profile(inputs: Sequence[_Tensor], batch: int) -> str:
    return ",".join(f"{t.name}:" + "x".join(str(d) for d in (batch, *t.dims)) for t in inputs)


def execution_providers(
    config: Mapping[str, Any],
    inputs: Sequence[_Tensor],
    kind: str,
    device_id: int,
    available: Sequence[str],
) -> list[Provider]:
    """The providers to ask onnxruntime for, best first; the CPU provider always ends the list."""
    if kind.upper() != "GPU" or "CUDAExecutionProvider" not in available:
        return ["CPUExecutionProvider"]
    providers: list[Provider] = []
    tensorrt = tensorrt_request(config)
    if tensorrt is not None and "TensorrtExecutionProvider" in available:
        options = {
            "device_id": str(device_id),
            "trt_fp16_enable": str(tensorrt.get("precision_mode", "FP32").upper() == "FP16"),
            "trt_engine_cache_enable": tensorrt.get("trt_engine_cache_enable", "false"),
            "trt_engine_cache_path": tensorrt.get("trt_engine_cache_path", ""),
        }
        if "max_workspace_size_bytes" in tensorrt:
            options["trt_max_workspace_size"] = tensorrt["max_workspace_size_bytes"]
        max_batch = int(config.get("max_batch_size", 0))
        if max_batch > 0 and all(-1 not in t.dims for t in inputs):
            # One profile for every batch size the dynamic batcher can form: without it the provider
            # builds a new engine for each new batch size, under traffic.
            preferred = config.get("dynamic_batching", {}).get("preferred_batch_size") or [
                max_batch
            ]
            options.update(
                trt_profile_min_shapes=_profile(inputs, 1),
                trt_profile_opt_shapes=_profile(
                    inputs, min(max(int(b) for b in preferred), max_batch)
                ),
                trt_profile_max_shapes=_profile(inputs, max_batch),
            )
        providers.append(
            ("TensorrtExecutionProvider", {k: v for k, v in options.items() if v != ""})
        )
    providers.append(("CUDAExecutionProvider", {"device_id": str(device_id)}))
    providers.append("CPUExecutionProvider")
    return providers


def int8_kernels_saturate(
    machine: str | None = None, cpu_flags: Iterable[str] | None = None
) -> bool:
    """Whether onnxruntime's fused INT8 CPU kernels can give wrong answers on this host.

    On x86-64 without VNNI, onnxruntime multiplies u8 activations by s8 weights with VPMADDUBSW, which
    adds each pair of products into a saturating int16 (onnxruntime's quantization guide warns of it).
    Measured on such a CPU (AMD EPYC, AVX2 only), ``efficientnet_lite0_int8`` against FP32 on held-out
    photos: min cosine 0.53, top-1 agreement 0.33 with the fused kernels; 0.974 and 0.75 with the same
    Q/DQ graph run as float math, which is what a VNNI CPU and TensorRT compute.

    Args:
        machine: ``platform.machine()`` by default.
        cpu_flags: the CPU's feature flags; read from ``/proc/cpuinfo`` by default (unreadable: none,
            so an x86-64 host of unknown features is taken to saturate: correct answers first).
    """
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return False
    flags = set(cpu_flags) if cpu_flags is not None else _cpu_flags()
    return not flags & _VNNI_FLAGS


def session_options(parameter: Callable[[str, str], str]) -> onnxruntime.SessionOptions:
    """A model instance's ``onnxruntime.SessionOptions`` from its config parameters, read through
    ``parameter(key, default)`` (the backend's ``BatchingModel.parameter``): thread counts
    (``intra_op_thread_count``, ``inter_op_thread_count``; 0: every core) and ``allow_spinning``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(parameter("intra_op_thread_count", "0"))
    options.inter_op_num_threads = int(parameter("inter_op_thread_count", "0"))
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime's idle pool threads spin for more work by default. Between two runs here the
    # request goes back through Triton, so they spin on cores Triton's own threads need, and with
    # queue policies that starvation costs Triton's batcher its wake-up (500 ms stalls; see
    # builders.triton_config.model_config). Measured on 2 cores, efficientnet_lite0, one
    # instance: P99 518 ms at concurrency 1 spinning, 19 ms not (benchmarks/cpu/batcher_wakeup).
    options.add_session_config_entry(SPINNING, parameter("allow_spinning", "0"))
    return options


def avoid_saturating_int8(options: Any) -> bool:
    """Make an ``onnxruntime.SessionOptions`` run Q/DQ graphs as float math where the fused INT8
    kernels would saturate (:func:`int8_kernels_saturate`); True when it did. Graphs without Q/DQ
    nodes are not affected. Correct answers cost speed there: INT8 then runs slower than FP32."""
    if not int8_kernels_saturate():
        return False
    options.add_session_config_entry(DISABLE_QDQ_FUSION, "1")
    return True


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
