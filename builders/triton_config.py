"""Triton ``config.pbtxt`` written through Triton's own schema (``ModelConfig`` protobuf).

Every field goes through ``tritonclient.grpc.model_config_pb2``, so a typo or a wrong type fails at
build time, not when Triton loads the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builders.spec import BatchingPolicy, TensorSpec

__all__ = [
    "data_type",
    "ensemble_config",
    "model_config",
    "read_config",
    "write_config",
]

_DATA_TYPES = {
    "float32": mc.TYPE_FP32,
    "float16": mc.TYPE_FP16,
    "float64": mc.TYPE_FP64,
    "int64": mc.TYPE_INT64,
    "int32": mc.TYPE_INT32,
    "int8": mc.TYPE_INT8,
    "uint8": mc.TYPE_UINT8,
    "bool": mc.TYPE_BOOL,
    "bytes": mc.TYPE_STRING,
}


def data_type(dtype: str) -> int:
    """Triton's data type enum for a numpy dtype name (``"bytes"`` for strings)."""
    return _DATA_TYPES[dtype]


def _io(tensors: Iterable[TensorSpec], cls: type) -> list:
    return [cls(name=t.name, data_type=data_type(t.dtype), dims=list(t.dims)) for t in tensors]


def model_config(
    name: str,
    *,
    inputs: Iterable[TensorSpec],
    outputs: Iterable[TensorSpec],
    batching: BatchingPolicy,
    platform: str = "",
    backend: str = "",
    parameters: Mapping[str, str] | None = None,
    gpu: bool = False,
    warmup: bool = True,
    versions_kept: int = 1,
) -> mc.ModelConfig:
    """Config for a model served by one backend (onnxruntime, python, tensorrt, pytorch).

    Args:
        warmup: add a zero-input warmup request of batch 1, so the first user request does not pay
            for session initialisation. Only for numeric inputs (Triton cannot synthesise strings).
        versions_kept: serve the newest N versions (``version_policy.latest``).
    """
    inputs, outputs = list(inputs), list(outputs)
    config = mc.ModelConfig(
        name=name,
        platform=platform,
        backend=backend,
        max_batch_size=batching.max_batch_size,
        input=_io(inputs, mc.ModelInput),
        output=_io(outputs, mc.ModelOutput),
        version_policy=mc.ModelVersionPolicy(latest=mc.ModelVersionPolicy.Latest(num_versions=versions_kept)),
        instance_group=[
            mc.ModelInstanceGroup(
                kind=mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU,
                count=batching.instance_count,
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
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    if warmup and all(t.dtype != "bytes" and -1 not in t.dims for t in inputs):
        sample = mc.ModelWarmup(name="zeros", batch_size=1 if batching.max_batch_size > 0 else 0)
        for t in inputs:
            sample.inputs[t.name].CopyFrom(
                mc.ModelWarmup.Input(data_type=data_type(t.dtype), dims=list(t.dims), zero_data=True)
            )
        config.model_warmup.append(sample)
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
            mc.ModelEnsembling.Step(model_name=model, model_version=-1, input_map=input_map, output_map=output_map)
        )
    return config


def write_config(config: mc.ModelConfig, path: Path) -> Path:
    path.write_text(text_format.MessageToString(config), encoding="utf-8")
    return path


def read_config(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(encoding="utf-8"), mc.ModelConfig())
