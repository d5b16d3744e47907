"""The load generator's own capacity: the same load against a model that answers at once.

A benchmark result means something only if the client was not the bottleneck. So every result is
printed beside the capacity of the load generator *with the same settings* (client, protocol,
payload, concurrency, processes): its throughput against an *instant twin* of the model under
test, a Python model with the same inputs, outputs and batching that returns zeros without work
(:mod:`loadtest.loadgen.instant_model`). The twin is loaded into the running Triton through its
model-repository API with the model file in the request (explicit model-control mode, as the
platform runs Triton), so any deployment can be measured and no repository is touched.

Capacity is a lower bound of what the client can do (the twin still passes through Triton): a
result well below it was not limited by the client; a result close to it may have been. So that
the bound is the client's, not the twin's, the twin does as little as Triton allows: it runs in
several stub processes (one Python stub answered 2,900-11,300 requests/s on an H200 host, under
the real model's own throughput with CUDA shared-memory inputs: ``benchmarks/h200/run11-gateway-rows``),
and it takes its inputs where they are instead of having Triton copy GPU inputs to the host first.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from loadtest.loadgen.runner import LoadError, LoadSpec, run_load
from loadtest.loadgen.samples import LoadResult
from loadtest.loadgen.targets import Target, TritonTarget
from serving.triton_clients import triton_client

__all__ = [
    "INSTANT_SUFFIX",
    "TWIN_INSTANCES",
    "instant_twin",
    "measure_capacity",
    "twin_config",
    "twin_target",
]

INSTANT_SUFFIX = "__instant"
_MODEL_FILE = Path(__file__).with_name("instant_model.py")
# Config fields the twin keeps: its interface and its batching. Everything about how the real model
# runs (platform, instances, parameters, warm-up, ensemble steps) goes.
_KEPT = ("max_batch_size", "input", "output", "dynamic_batching")
#: the twin's stub processes: each answers requests one at a time in Python
TWIN_INSTANCES = 4


def twin_config(
    config: dict[str, object], name: str, instances: int = TWIN_INSTANCES
) -> dict[str, object]:
    """The instant twin's config (Triton's JSON form) for a model whose config is ``config``, in
    ``instances`` stub processes."""
    twin = {key: config[key] for key in _KEPT if key in config}
    batching = twin.get("dynamic_batching")
    if isinstance(batching, dict):
        # How batches form, not the queue policy and priority levels: a twin that refused requests
        # (a full queue) would measure the rejections, not the client.
        twin["dynamic_batching"] = {
            key: value
            for key, value in batching.items()
            if key in ("max_queue_delay_microseconds", "preferred_batch_size")
        }
    twin.update(
        name=name,
        backend="python",
        instance_group=[{"count": instances, "kind": "KIND_CPU"}],
        # It reads only the first input's shape: a CUDA shared-memory input stays on the GPU.
        parameters={"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}},
    )
    return twin


@contextlib.contextmanager
def instant_twin(
    triton_http_url: str, model: str, timeout_s: float = 300.0, instances: int = TWIN_INSTANCES
) -> Iterator[str]:
    """Load the instant twin of ``model`` (in ``instances`` stub processes) into the Triton at
    ``triton_http_url``; yields its name.

    Raises:
        tritonclient.utils.InferenceServerException: Triton refused it (not in explicit mode, ...).
    """

    name = model + INSTANT_SUFFIX
    client = triton_client(triton_http_url, network_timeout=timeout_s, connection_timeout=timeout_s)
    try:
        config = twin_config(client.get_model_config(model), name, instances)
        client.load_model(
            name, config=json.dumps(config), files={"file:1/model.py": _MODEL_FILE.read_bytes()}
        )
        try:
            yield name
        finally:
            with contextlib.suppress(
                Exception
            ):  # Triton may be gone already; nothing to clean then
                client.unload_model(name)
    finally:
        client.close()


def twin_target(target: TritonTarget, twin: str, url: str | None = None) -> TritonTarget:
    """``target`` aimed at the twin: same client, protocol and payload; no credentials, no check."""
    return replace(
        target,
        model=twin,
        model_version="",
        url=url or target.url,
        headers={},
        check=None,
        priority=0,
        name=f"{target.name} (capacity)",
    )


def measure_capacity(spec: LoadSpec, capacity_target: Target, processes: int = 1) -> LoadResult:
    """The load generator's result for ``spec`` with its target replaced by ``capacity_target``.

    Raises:
        LoadError: the capacity run itself failed (its result would mean nothing).
    """
    result = run_load(
        replace(spec, target=capacity_target, name=f"{spec.label} (capacity)"), processes
    )
    if result.errors or not result.requests:
        raise LoadError(
            f"measuring the load generator's capacity failed: {result.error_summary() or 'no answers'}"
        )
    return result
