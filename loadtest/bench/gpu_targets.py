"""The GPU benchmark's clients: one load-generator target per configuration it can measure.

:func:`gpu_targets` names them as ``--points`` and the report do (``tensor http``, ``tensor
cuda-shm x8``, ``jpeg gateway``, ``naive`` ...); :mod:`loadtest.bench.gpu` runs them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from loadtest.bench.gpu_setup import (
    NOBATCH,
    PIPELINE,
    PIPELINE_COMPILED,
    PIPELINE_COMPILED_OVERLAP,
    PIPELINE_OVERLAP,
    TENSOR,
)
from loadtest.bench.servers import BenchGateway, naive_target
from loadtest.loadgen import Target, TritonTarget
from loadtest.payloads import image_tensors, jpeg_images
from serving.launcher import TritonServer

__all__ = ["GATEWAY_SUFFIX", "IMAGES_PER_REQUEST", "gpu_targets"]

#: a configuration through the gateway is named after the direct one it is compared with
GATEWAY_SUFFIX = " gateway"
#: images per request where a configuration sends several (as perf_analyzer's ``-b``); the rest send one
IMAGES_PER_REQUEST = {"tensor cuda-shm x8": 8}


def _tensor_inputs(per_request: int = 1) -> tuple[dict[str, np.ndarray], ...]:
    images = image_tensors()
    return tuple(
        {"INPUT__0": images[np.arange(i, i + per_request) % len(images)]}
        for i in range(0, len(images), per_request)
    )


def _jpeg_inputs() -> tuple[dict[str, np.ndarray], ...]:
    return tuple(
        {"IMAGE": np.frombuffer(data, dtype=np.uint8).reshape(1, -1)} for data in jpeg_images()
    )


def gpu_targets(
    triton: TritonServer, gateway: BenchGateway | None, naive: str | None, compiled: str, gpu: bool
) -> dict[str, Target]:
    """The clients of every configuration, by name: Triton direct (tensor and JPEG paths, shared
    memory, batching off, the compiled flavour where built), through the gateway, and the naive
    server (CPU runs lack the CUDA shared-memory ones)."""
    url = triton.http_url
    # Direct clients ask for the first priority level, as the gateway does for its best tier: without
    # one a request lands on the lowest level, whose queue (64) overflows at these concurrencies.
    tensor = TritonTarget(
        url=url,
        model=TENSOR,
        inputs=_tensor_inputs(),
        outputs=("OUTPUT__0",),
        name="tensor http",
        priority=1,
    )
    jpeg = TritonTarget(
        url=url,
        model=PIPELINE,
        inputs=_jpeg_inputs(),
        outputs=("SCORES", "CLASS_IDS"),
        name="jpeg",
        priority=1,
    )
    targets: dict[str, Target] = {
        "tensor http": tensor,
        "tensor system-shm": replace(tensor, shared_memory="system", name="tensor system-shm"),
        "tensor cuda-shm": replace(tensor, shared_memory="cuda", name="tensor cuda-shm"),
        # The image over CUDA shared memory, its 4 KB of logits back in the body: Triton then copies
        # no output into GPU memory per request (its output step, as perf_analyzer's way pays it).
        "tensor cuda-shm inputs": replace(
            tensor, shared_memory="cuda", shared_outputs=False, name="tensor cuda-shm inputs"
        ),
        "tensor cuda-shm x8": replace(
            tensor,
            inputs=_tensor_inputs(IMAGES_PER_REQUEST["tensor cuda-shm x8"]),
            shared_memory="cuda",
            name="tensor cuda-shm x8",
        ),
        "tensor no-batching": replace(tensor, model=NOBATCH, name="tensor no-batching"),
        # Batching on vs off where the transport is not the limit (over HTTP both move ~600 KB per image).
        "tensor no-batching cuda-shm": replace(
            tensor, model=NOBATCH, shared_memory="cuda", name="tensor no-batching cuda-shm"
        ),
        "jpeg": jpeg,
        "jpeg overlap": replace(jpeg, model=PIPELINE_OVERLAP, name="jpeg overlap"),
    }
    if not gpu:
        del (
            targets["tensor cuda-shm"],
            targets["tensor cuda-shm inputs"],
            targets["tensor cuda-shm x8"],
            targets["tensor no-batching cuda-shm"],
        )
    if compiled:
        shared = "cuda" if gpu else "system"
        targets["tensor compiled cuda-shm"] = replace(
            tensor, model=compiled, shared_memory=shared, name="tensor compiled cuda-shm"
        )
        targets["jpeg compiled"] = replace(jpeg, model=PIPELINE_COMPILED, name="jpeg compiled")
        targets["jpeg compiled overlap"] = replace(
            jpeg, model=PIPELINE_COMPILED_OVERLAP, name="jpeg compiled overlap"
        )
    if gateway is not None:
        base, key, _ = gateway
        # The gateway sets the priority from the key's tier and refuses one a client sends.
        name = "jpeg" + GATEWAY_SUFFIX
        targets[name] = replace(
            jpeg,
            url=base.removeprefix("http://"),
            headers={"Authorization": f"Bearer {key}"},
            name=name,
            priority=0,
        )
    if naive is not None:
        targets["naive"] = naive_target(naive, image_tensors())
    return targets
