"""Triton ``config.pbtxt`` written through Triton's own schema (``ModelConfig`` protobuf).

Every field goes through ``tritonclient.grpc.model_config_pb2``, so a typo or a wrong type fails at
build time, not when Triton loads the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import np_to_triton_dtype

from builders.spec import BatchingPolicy, ModelSpec, TensorSpec
from serving.limits import DEFAULT_LIMITS, QueueLimits

__all__ = [
    "ConfigOptions",
    "apply_queue_policy",
    "data_type",
    "is_tensorrt",
    "ensemble_config",
    "model_config",
    "read_config",
    "spec_config",
    "tensorrt_accelerator",
    "write_config",
]


def data_type(dtype: str) -> int:
    """Triton's data type enum for a numpy dtype name (``"bytes"`` for strings), by tritonclient's map."""
    if dtype == "bytes":
        return mc.TYPE_STRING
    return mc.DataType.Value("TYPE_" + np_to_triton_dtype(np.dtype(dtype)))


def _io(tensors: Iterable[TensorSpec], cls: type) -> list:
    return [cls(name=t.name, data_type=data_type(t.dtype), dims=list(t.dims)) for t in tensors]


@dataclass(frozen=True)
class ConfigOptions:
    """How Triton runs one entry, beside its tensors and batching (see :func:`model_config`).

    Attributes:
        platform: Triton's ``platform`` (``onnxruntime_onnx``, ``pytorch_libtorch``, ...), or "".
        backend: Triton's ``backend`` (``python``, ...), or "".
        parameters: the config's ``parameters``, as strings.
        gpu: ``KIND_GPU`` instances instead of ``KIND_CPU``.
        warmup: add a zero-input warmup request of batch 1, so the first user request does not pay
            for session initialisation. Only for numeric inputs (Triton cannot synthesise strings).
        versions_kept: serve the newest N versions (``version_policy.latest``).
    """

    platform: str = ""
    backend: str = ""
    parameters: Mapping[str, str] = field(default_factory=dict)
    gpu: bool = False
    warmup: bool = True
    versions_kept: int = 1


def model_config(
    name: str,
    *,
    inputs: Iterable[TensorSpec],
    outputs: Iterable[TensorSpec],
    batching: BatchingPolicy,
    options: ConfigOptions,
) -> mc.ModelConfig:
    """Config for a model served by one backend (onnxruntime, python, tensorrt, pytorch).

    Args:
        batching: its ``instance_count``, when None, is ``QueueLimits.default_instances`` (two). Every
            model gets priority levels and bounded queues (:func:`apply_queue_policy`), and those turn
            off the dynamic batcher's payload prefetching; without it Triton's batcher can miss the
            wake-up of an instance that finishes (``dynamic_batch_scheduler.cc``,
            ``WaitForPayloadSlotAvailable``: the instance notifies before it counts as waiting again,
            and nothing notifies once it does), and a queued request waits for the next arrival or
            the batcher's 500 ms default wait. Measured with ``efficientnet_lite0`` on a 2-core CPU
            (``benchmarks/cpu/batcher_wakeup``): one instance whose onnxruntime threads spin, P99
            518-608 ms at concurrency 1-8; one instance whose threads sleep (the onnxruntime backend's
            default), P99 19-133 ms but still a 576 ms request at concurrency 4; two instances, no
            request over 273 ms. While one instance runs the other is waiting, so a queued request
            waits at most for one execution.
        options: platform or backend, parameters, instance kind, warmup, versions kept.
    """
    instances = (
        DEFAULT_LIMITS.queue.default_instances
        if batching.instance_count is None
        else batching.instance_count
    )
    inputs, outputs = list(inputs), list(outputs)
    config = mc.ModelConfig(
        name=name,
        platform=options.platform,
        backend=options.backend,
        max_batch_size=batching.max_batch_size,
        input=_io(inputs, mc.ModelInput),
        output=_io(outputs, mc.ModelOutput),
        version_policy=mc.ModelVersionPolicy(
            latest=mc.ModelVersionPolicy.Latest(num_versions=options.versions_kept)
        ),
        instance_group=[
            mc.ModelInstanceGroup(
                kind=mc.ModelInstanceGroup.KIND_GPU
                if options.gpu
                else mc.ModelInstanceGroup.KIND_CPU,
                count=instances,
            )
        ],
    )
    if batching.max_batch_size > 0:
        config.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=list(batching.preferred_batch_sizes),
                max_queue_delay_microseconds=batching.max_queue_delay_us,
            )
        )
    apply_queue_policy(config)
    for key, value in options.parameters.items():
        config.parameters[key].string_value = value
    if options.warmup and all(t.dtype != "bytes" and -1 not in t.dims for t in inputs):
        sample = mc.ModelWarmup(name="zeros", batch_size=1 if batching.max_batch_size > 0 else 0)
        for t in inputs:
            sample.inputs[t.name].CopyFrom(
                mc.ModelWarmup.Input(
                    data_type=data_type(t.dtype), dims=list(t.dims), zero_data=True
                )
            )
        config.model_warmup.append(sample)
    return config


def spec_config(
    spec: ModelSpec,
    name: str,
    *,
    platform: str,
    filename: str,
    gpu: bool,
    parameters: Mapping[str, str] | None = None,
) -> mc.ModelConfig:
    """:func:`model_config` of an entry ``name`` serving ``spec``'s own tensors with its batching,
    from the file ``filename`` of its version folder."""
    config = model_config(
        name,
        inputs=spec.inputs,
        outputs=spec.outputs,
        batching=spec.batching,
        options=ConfigOptions(platform=platform, parameters=parameters or {}, gpu=gpu),
    )
    config.default_model_filename = filename
    return config


def apply_queue_policy(
    config: mc.ModelConfig, limits: QueueLimits = DEFAULT_LIMITS.queue
) -> mc.ModelConfig:
    """Give ``config``'s scheduler priority levels and a bounded, rejecting queue per level.

    The levels and policies are ``serving.limits``' (the gateway maps tiers to the levels). Each
    level's queue is bounded and rejects a request that waited past its timeout (a request's own
    ``timeout`` may shorten it), so work nobody waits for any more is dropped, not run. A model that
    does not batch (``max_batch_size`` 0) gets the scheduler too: without it Triton ignores a
    request's timeout and priority; with it, it only queues. With these queues a model wants two
    instances or more (:func:`model_config` says why).

    Args:
        config: a model config (not an ensemble: ensembles have no queue of their own).
        limits: the levels and their policies.

    Returns:
        ``config``, changed in place.
    """
    batcher = config.dynamic_batching
    batcher.priority_levels = limits.priority_levels
    batcher.default_priority_level = limits.default_priority_level
    for level in range(1, limits.priority_levels + 1):
        policy = limits.policy(level)
        batcher.priority_queue_policy[level].CopyFrom(
            mc.ModelQueuePolicy(
                timeout_action=mc.ModelQueuePolicy.REJECT,
                default_timeout_microseconds=policy.default_timeout_us,
                allow_timeout_override=policy.allow_timeout_override,
                max_queue_size=policy.max_queue_size,
            )
        )
    # A level without an entry falls back to the default policy: bounded too.
    batcher.default_queue_policy.CopyFrom(
        batcher.priority_queue_policy[limits.default_priority_level]
    )
    return config


def ensemble_config(
    name: str,
    *,
    inputs: Iterable[TensorSpec],
    outputs: Iterable[TensorSpec],
    max_batch_size: int,
    steps: Iterable[tuple[str, Mapping[str, str], Mapping[str, str]]],
) -> mc.ModelConfig:
    """An ensemble: ``steps`` are (model, {model input: ensemble tensor}, {model output: ensemble tensor})."""
    config = mc.ModelConfig(
        name=name,
        platform="ensemble",
        max_batch_size=max_batch_size,
        input=_io(inputs, mc.ModelInput),
        output=_io(outputs, mc.ModelOutput),
    )
    for model, input_map, output_map in steps:
        config.ensemble_scheduling.step.append(
            mc.ModelEnsembling.Step(
                model_name=model, model_version=-1, input_map=input_map, output_map=output_map
            )
        )
    return config


def write_config(config: mc.ModelConfig, path: Path) -> Path:
    path.write_text(text_format.MessageToString(config), encoding="utf-8")
    return path


def read_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())


#: TensorRT's scratch memory per engine when onnxruntime runs a model through it (1 GiB)
TENSORRT_WORKSPACE_BYTES = 1 << 30


def tensorrt_accelerator(config: mc.ModelConfig, precision_mode: str = "FP16") -> mc.ModelConfig:
    """Ask the onnxruntime backend to run ``config`` through TensorRT, as the native backend reads it:
    ``optimization { execution_accelerators { gpu_execution_accelerator: [{ name: "tensorrt" }] } }``.

    Args:
        precision_mode: ``FP32`` or ``FP16`` (the native backend's ``precision_mode`` parameter).
    """
    accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add(
        name="tensorrt"
    )
    accelerator.parameters["precision_mode"] = precision_mode
    accelerator.parameters["max_workspace_size_bytes"] = str(TENSORRT_WORKSPACE_BYTES)
    return config


def is_tensorrt(config: mc.ModelConfig) -> bool:
    """Whether Triton serves ``config`` with its TensorRT backend (``tensorrt_plan``)."""
    return config.platform == "tensorrt_plan" or config.backend == "tensorrt"
