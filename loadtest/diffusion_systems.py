"""The two systems the diffusion benchmarks compare, each generating the same seeds' images:
:class:`TritonSystem` (``stable_diffusion_torch`` in the embedded Triton, concurrent gRPC clients)
and :class:`DiffusersSystem` (diffusers' ``StableDiffusionPipeline`` in this process, one batched
call). :mod:`loadtest.diffusion_bench` and :mod:`loadtest.diffusion_process` time them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from serving.triton_clients import triton_client

__all__ = ["BASE_SEED", "NEGATIVE", "PROMPT", "DiffusersSystem", "Generate", "TritonSystem"]

PROMPT = "a photograph of an astronaut riding a horse on the moon, highly detailed"
NEGATIVE = "blurry, low quality"
BASE_SEED = 1000

Generate = Callable[[int, int, int, list[int]], tuple[list[np.ndarray], list[float]]]
"""``(height, width, steps, seeds) -> (images, latencies_s)``: one client's or one call's images."""


class TritonSystem:
    """``stable_diffusion_torch`` served by the embedded Triton; one gRPC client per concurrent sender.

    Clients are connected before any timing, and the senders of a point start together (a barrier),
    as clients already talking to a server would.
    """

    name = "triton"

    def __init__(self, server: Any, model: str, clients: int) -> None:

        self.server, self.model = server, model
        self.clients = [triton_client(server.grpc_url, "grpc") for _ in range(clients)]
        for client in self.clients:
            client.is_server_live()

    def generate(
        self,
        height: int,
        width: int,
        steps: int,
        seeds: list[int],
        scheduler: str = "",
        client: int = 0,
    ) -> tuple[list[np.ndarray], list[float]]:
        import tritonclient.grpc as grpc

        images, latencies = [], []
        for seed in seeds:
            # Every request sends the same inputs: Triton's dynamic batcher merges only requests that do.
            values = {
                "PROMPT": (PROMPT.encode(), "BYTES", np.object_),
                "NEGATIVE_PROMPT": (NEGATIVE.encode(), "BYTES", np.object_),
                "STEPS": (steps, "INT32", np.int32),
                "HEIGHT": (height, "INT32", np.int32),
                "WIDTH": (width, "INT32", np.int32),
                "SEED": (seed, "INT64", np.int64),
                "SCHEDULER": ((scheduler or "default").encode(), "BYTES", np.object_),
            }
            inputs = []
            for name, (value, kind, dtype) in values.items():
                tensor = grpc.InferInput(name, [1, 1], kind)
                tensor.set_data_from_numpy(np.array([[value]], dtype=dtype))
                inputs.append(tensor)
            started = time.perf_counter()
            result = self.clients[client].infer(self.model, inputs, client_timeout=600)
            latencies.append(time.perf_counter() - started)
            images.append(result.as_numpy("IMAGE")[0])
        return images, latencies

    def run(
        self,
        height: int,
        width: int,
        steps: int,
        concurrency: int,
        rounds: int,
        schedulers: Sequence[str] = ("",),
    ) -> tuple[list[np.ndarray], list[float], float]:
        """``concurrency`` clients, ``rounds`` requests each; images of the first round by client."""
        start = threading.Barrier(concurrency)

        def client(k: int) -> tuple[list[np.ndarray], list[float]]:
            seeds = [BASE_SEED + k + r * concurrency for r in range(rounds)]
            start.wait()
            return self.generate(
                height, width, steps, seeds, schedulers[k % len(schedulers)], client=k
            )

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            outcomes = list(pool.map(client, range(concurrency)))
        wall = time.perf_counter() - started
        return [o[0][0] for o in outcomes], [t for o in outcomes for t in o[1]], wall

    def statistics(self) -> dict[str, float]:
        stats = self.clients[0].get_inference_statistics(self.model).model_stats[0]
        return {
            "requests": stats.inference_count,
            "executions": stats.execution_count,
            "queue_s": stats.inference_stats.queue.ns / 1e9,
            "compute_s": stats.inference_stats.compute_infer.ns / 1e9,
        }

    def settled(
        self, before: dict[str, float], requests: int, log_from: int
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Statistics and loop log lines since ``before``, once Triton has accounted for ``requests``.

        The model answers each request as soon as its image is ready, before ``execute()`` returns:
        Triton counts the execution (and the model logs its loop) a moment after the client has its
        answer.
        """
        deadline = time.monotonic() + 30
        while True:
            after = self.statistics()
            delta = {k: after[k] - before[k] for k in after}
            loops = _loops(list(self.server.iter_log())[log_from:])
            if (
                delta["requests"] >= requests and len(loops) >= delta["executions"]
            ) or time.monotonic() > deadline:
                return delta, loops
            time.sleep(0.05)


class DiffusersSystem:
    """diffusers' ``StableDiffusionPipeline`` in this process; a batch of ``c`` prompts per call."""

    name = "diffusers"

    def __init__(self, checkpoint: Path, device: str) -> None:
        import torch
        from diffusers import StableDiffusionPipeline

        self.torch, self.device = torch, device
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        self.pipe = StableDiffusionPipeline.from_pretrained(
            str(checkpoint),
            dtype=dtype,
            safety_checker=None,
            requires_safety_checker=False,
            local_files_only=True,
        )
        self.pipe = self.pipe.to(device)
        self.pipe.set_progress_bar_config(disable=True)

    def call(
        self, height: int, width: int, steps: int, seeds: list[int]
    ) -> tuple[list[np.ndarray], float]:
        generators = [self.torch.Generator("cpu").manual_seed(s) for s in seeds]
        started = time.perf_counter()
        out = self.pipe(
            [PROMPT] * len(seeds),
            negative_prompt=[NEGATIVE] * len(seeds),
            num_inference_steps=steps,
            height=height,
            width=width,
            generator=generators if len(seeds) > 1 else generators[0],
            output_type="np",
        ).images
        seconds = time.perf_counter() - started
        return [(image * 255).round().astype(np.uint8) for image in out], seconds

    def generate(
        self, height: int, width: int, steps: int, seeds: list[int]
    ) -> tuple[list[np.ndarray], list[float]]:
        images, seconds = self.call(height, width, steps, seeds)
        return images, [seconds] * len(seeds)

    def run(
        self, height: int, width: int, steps: int, concurrency: int, rounds: int
    ) -> tuple[list[np.ndarray], list[float], float]:
        first: list[np.ndarray] = []
        latencies: list[float] = []
        started = time.perf_counter()
        for r in range(rounds):
            images, seconds = self.call(
                height, width, steps, [BASE_SEED + k + r * concurrency for k in range(concurrency)]
            )
            first = first or images
            latencies += [seconds] * concurrency
        return first, latencies, time.perf_counter() - started


# -- measuring ------------------------------------------------------------------------------------


_LOOP = re.compile(
    r"loop rows=(\d+) size=(\S+) unet_calls=(\d+) prepare_ms=([\d.]+) denoise_ms=([\d.]+) decode_ms=([\d.]+)"
)


def _loops(lines: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for line in lines:
        match = _LOOP.search(line)
        if match:
            rows, size, calls, prepare, denoise, decode = match.groups()
            found.append(
                {
                    "rows": int(rows),
                    "size": size,
                    "unet_calls": int(calls),
                    "prepare_ms": float(prepare),
                    "denoise_ms": float(denoise),
                    "decode_ms": float(decode),
                }
            )
    return found
