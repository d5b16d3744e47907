"""Configs are written and read through Triton's ``ModelConfig`` schema, never matched as text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import triton_to_np_dtype

from builders.triton_config import data_type, is_tensorrt, read_config, write_config


@pytest.mark.parametrize(
    "dtype", ["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]
)
def test_data_types_follow_tritonclients_map(dtype: str) -> None:
    name = mc.DataType.Name(data_type(dtype)).removeprefix("TYPE_")
    assert np.dtype(triton_to_np_dtype(name)) == np.dtype(dtype)


def test_strings_are_type_string() -> None:
    assert data_type("bytes") == mc.TYPE_STRING


def test_tensorrt_entries_are_told_by_their_platform_not_their_name(tmp_path: Path) -> None:
    entries = {
        "looks_like_trt_but_onnx": mc.ModelConfig(
            name="looks_like_trt_but_onnx", platform="onnxruntime_onnx"
        ),
        "engine": mc.ModelConfig(name="engine", platform="tensorrt_plan"),
        "engine_by_backend": mc.ModelConfig(name="engine_by_backend", backend="tensorrt"),
        # "tensorrt_plan" in a parameter value must not make an entry a TensorRT one
        "python_step": mc.ModelConfig(
            name="python_step",
            backend="python",
            parameters={"note": mc.ModelParameter(string_value="tensorrt_plan")},
        ),
    }
    found = {}
    for name, config in entries.items():
        path = write_config(config, tmp_path / f"{name}.pbtxt")
        found[name] = is_tensorrt(read_config(path))
    assert found == {
        "looks_like_trt_but_onnx": False,
        "engine": True,
        "engine_by_backend": True,
        "python_step": False,
    }


def test_every_generated_model_has_priority_levels_and_a_bounded_rejecting_queue(
    model_repository: Path,
) -> None:
    from serving.limits import DEFAULT_LIMITS

    limits = DEFAULT_LIMITS.queue
    checked = []
    for path in sorted(model_repository.glob("*/config.pbtxt")):
        config = read_config(path)
        if config.platform == "ensemble":
            assert not config.HasField("dynamic_batching"), "ensembles have no queue of their own"
            continue
        batcher = config.dynamic_batching
        assert batcher.priority_levels == limits.priority_levels, config.name
        assert batcher.default_priority_level == limits.default_priority_level, config.name
        policies = {
            level: batcher.priority_queue_policy[level]
            for level in range(1, limits.priority_levels + 1)
        }
        for level, policy in [*policies.items(), (0, batcher.default_queue_policy)]:
            assert policy.timeout_action == mc.ModelQueuePolicy.REJECT, (config.name, level)
            assert 0 < policy.max_queue_size and 0 < policy.default_timeout_microseconds, (
                config.name,
                level,
            )
        # With queue policies one instance can leave a queued request waiting 500 ms (apply_queue_policy),
        # so two are the default. A diffusion pipeline (its config names its scheduler classes) keeps
        # one on purpose (builders/families/diffusion/pipelines.py); `inferctl up` adds one to this
        # repository when the e2e tests have run before.
        wanted = 1 if "scheduler_classes" in config.parameters else limits.default_instances
        assert config.instance_group and all(
            g.count == wanted if wanted == 1 else g.count >= wanted for g in config.instance_group
        ), config.name
        checked.append(config.name)
    assert {"efficientnet_lite0", "image_preprocess", "minilm_encoder", "text_tokenizer"} <= set(
        checked
    )


def test_a_model_gets_the_queue_minimum_of_instances_unless_its_spec_names_a_count() -> None:
    from builders.spec import BatchingPolicy, TensorSpec
    from builders.triton_config import ConfigOptions, model_config
    from serving.limits import DEFAULT_LIMITS

    def counts(batching: BatchingPolicy) -> list[int]:
        config = model_config(
            "m",
            inputs=[TensorSpec("x", "float32", (4,))],
            outputs=[TensorSpec("y", "float32", (4,))],
            batching=batching,
            options=ConfigOptions(backend="python"),
        )
        assert (
            config.dynamic_batching.priority_levels > 0
        )  # the queues that make one instance a poor default
        return [g.count for g in config.instance_group]

    assert counts(BatchingPolicy(max_batch_size=8)) == [DEFAULT_LIMITS.queue.default_instances]
    assert counts(BatchingPolicy(max_batch_size=0)) == [DEFAULT_LIMITS.queue.default_instances]
    assert counts(BatchingPolicy(max_batch_size=8, instance_count=1)) == [1]
    assert counts(BatchingPolicy(max_batch_size=8, instance_count=3)) == [3]


def test_a_queue_minimum_below_one_instance_is_refused() -> None:
    from serving.limits import QueueLimits

    with pytest.raises(ValueError, match="default_instances"):
        QueueLimits(default_instances=0)
