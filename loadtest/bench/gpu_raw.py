"""The GPU ceilings, in process, no server: what the serving figures are measured against.

- :func:`tensor_ceiling`: the TorchScript classifier in FP16 with the batch already on the GPU, at
  every batch size asked for, three ways: ``eager`` (NCHW), ``channels_last`` and ``cuda-graph``
  (channels_last captured by the serving backend's own :class:`BatchRunner`); the compiled
  flavour too when it was built (``compiled``, loaded as the backend loads it and captured the same
  way; reported beside, not part of the ceiling's definition).
  The ceiling is the best of eager / channels_last / CUDA graph over all batch sizes.
- :func:`jpeg_profile`: the GPU image pipeline's steps on one batch of real JPEGs, each timed alone
  (CUDA-synchronised): header checks, nvJPEG decode, resize/crop/normalise, classifier + top-k, the
  copy back. Where an execution's time goes, without Triton, HTTP or the stub around it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench.raw import in_process_result, tiled
from loadtest.bench.settings import Result

__all__ = ["jpeg_profile", "tensor_ceiling"]

CEILING_MODES = ("eager", "channels_last", "cuda-graph")


def _timed(name: str, run: Callable[[], Any], batch: int, seconds: float, note: str) -> Result:
    import torch

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    latencies: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or len(latencies) < 5:
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return in_process_result(name, latencies, batch, elapsed, note)


def tensor_ceiling(
    model_file: Path,
    images: np.ndarray,
    batches: Sequence[int],
    seconds: float,
    compiled_file: Path | None = None,
) -> list[Result]:
    """One row per (mode, batch size); throughput in images/s, latency per batch."""
    import torch

    from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec
    from serving.backends.pytorch.torch_module import TorchModule

    print("[bench] GPU ceiling in process ...", file=sys.stderr, flush=True)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = False  # as the serving backend
    results: list[Result] = []
    nchw = torch.jit.load(str(model_file), map_location=device).eval().half()
    channels_last = TorchModule(str(model_file), device, torch.float16, True, [torch.float32])
    compiled_module = (
        TorchModule(str(compiled_file), device, torch.float16, True, [torch.float32])
        if compiled_file
        else None
    )
    for size in batches:
        x = torch.from_numpy(tiled(images, size)).to(device)

        def eager(x: torch.Tensor = x) -> Any:
            with torch.inference_mode(), torch.jit.optimized_execution(False):
                return nchw(x.half()).float()

        def cl(x: torch.Tensor = x) -> Any:
            with torch.inference_mode():
                return channels_last(x)

        results.append(
            _timed("raw eager", eager, size, seconds, "TorchScript FP16 NCHW, batch on the GPU")
        )
        results.append(
            _timed(
                "raw channels_last",
                cl,
                size,
                seconds,
                "TorchScript FP16 channels_last, batch on the GPU",
            )
        )
        runner = BatchRunner(
            channels_last, [InputSpec(tuple(x.shape[1:]), torch.float32)], device, (size,)
        )

        def graph(runner: BatchRunner = runner, x: torch.Tensor = x, size: int = size) -> Any:
            return runner.run(size, lambda rows: rows[0].copy_(x))

        results.append(
            _timed(
                "raw cuda-graph",
                graph,
                size,
                seconds,
                "channels_last FP16 as one CUDA graph (the backend's runner)",
            )
        )
        if compiled_module is not None:
            compiled = BatchRunner(
                compiled_module, [InputSpec(tuple(x.shape[1:]), torch.float32)], device, (size,)
            )

            def served(
                runner: BatchRunner = compiled, x: torch.Tensor = x, size: int = size
            ) -> Any:
                return runner.run(size, lambda rows: rows[0].copy_(x))

            results.append(
                _timed(
                    "raw compiled",
                    served,
                    size,
                    seconds,
                    f"{compiled_module.kind} flavour (builders/compiled.py) as one CUDA graph",
                )
            )
            del compiled
        del runner
        torch.cuda.empty_cache()
    return results


def jpeg_profile(
    model_file: Path, jpegs: Sequence[bytes], batch: int, repeats: int = 20
) -> dict[str, Any]:
    """Milliseconds per batch of each GPU pipeline step (median of ``repeats``), and the images/s
    the steps allow when run back to back in one process."""
    import torch

    from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec
    from serving.backends.pytorch.torch_module import TorchModule
    from serving.gpu_images import (
        DEFAULT_CHUNK,
        Preprocessing,
        decode,
        host_bytes,
        preprocess_into,
        read_header,
    )

    device = torch.device("cuda")
    p = Preprocessing()
    encoded = [
        torch.frombuffer(bytearray(jpegs[i % len(jpegs)]), dtype=torch.uint8) for i in range(batch)
    ]
    model = TorchModule(str(model_file), device, torch.float16, True, [torch.float32])

    def top5(pixels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        (logits,) = model(pixels)
        return tuple(torch.softmax(logits, -1).topk(5, -1))

    runner = BatchRunner(top5, [InputSpec((3, p.size, p.size), torch.float16)], device, (batch,))
    steps: dict[str, list[float]] = {
        "headers": [],
        "decode": [],
        "resize_normalise": [],
        "classify_top5": [],
        "copy_back": [],
    }
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        headers = [read_header(host_bytes(e), p) for e in encoded]
        t1 = time.perf_counter()
        images = decode(encoded, headers, device).images
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        outputs = runner.run(
            batch,
            lambda rows, images=images: preprocess_into(images, rows[0], p),  # type: ignore[misc]
        )
        # preprocess_into ran inside run() on the runner's stream; time it apart by a second pass
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        runner.to_host(outputs)
        t4 = time.perf_counter()
        with torch.cuda.stream(runner.stream):  # type: ignore[arg-type]
            scratch = torch.empty(batch, 3, p.size, p.size, device=device, dtype=torch.float16)
            preprocess_into(images, scratch, p)  # type: ignore[arg-type]
        torch.cuda.synchronize()
        t5 = time.perf_counter()
        for key, value in (
            ("headers", t1 - t0),
            ("decode", t2 - t1),
            ("resize_normalise", t5 - t4),
            ("classify_top5", (t3 - t2) - (t5 - t4)),
            ("copy_back", t4 - t3),
        ):
            steps[key].append(value * 1000.0)
    median = {key: float(np.median(values[2:])) for key, values in steps.items()}
    total = sum(median.values())
    del runner
    pipelined = _pipelined(top5, p, encoded, DEFAULT_CHUNK, repeats, device)
    return {
        "batch": batch,
        "ms_per_batch": median,
        "serial_images_per_s": batch / total * 1000.0 if total else 0.0,
        "chunk": DEFAULT_CHUNK,
        "pipelined_ms_per_batch": pipelined,
        "pipelined_images_per_s": batch / pipelined * 1000.0 if pipelined else 0.0,
        "note": "one process, steps serial and CUDA-synchronised; classify_top5 = run() minus a separate "
        "resize pass; pipelined: what image_classifier_gpu's execute() does (headers, then decode of "
        "each chunk overlapping the GPU work of the one before, one wait); JPEGs are the sample "
        "photos (<=512 px, quality 90)",
    }


def _pipelined(
    top5: Callable[..., Any], p: Any, encoded: Sequence[Any], chunk: int, repeats: int, device: Any
) -> float:
    """Median milliseconds of the model's pipelined schedule on one batch (see ``jpeg_profile``)."""
    import torch

    from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec
    from serving.gpu_images import decode_chunks, host_bytes, preprocess_into, read_header

    runner = BatchRunner(
        top5,
        [InputSpec((3, p.size, p.size), torch.float16)],
        device,
        tuple(sorted({min(chunk, len(encoded)), len(encoded) % chunk or chunk})),
    )
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        headers = [read_header(host_bytes(e), p) for e in encoded]
        kept = []
        for _live, decoded in decode_chunks(encoded, headers, device, chunk):
            images = decoded.images
            outputs = runner.run(
                len(images),
                lambda rows, images=images: preprocess_into(images, rows[0], p),  # type: ignore[misc]
            )
            kept.append((images, runner.to_host(outputs, wait=False)))
        runner.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(times[2:]))
