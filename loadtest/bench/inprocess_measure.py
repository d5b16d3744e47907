"""The in-process JPEG pipeline's measurements, one batch size each: ``serial`` (every step of a
batch after the last one's), ``overlapped`` (:class:`serving.gpu_overlap.OverlappedPipeline` and its
:data:`VARIANTS`) and :func:`gil_probe` (whether a thread decoding with nvJPEG lets Python run in
another); :func:`classifier_file` writes the classifier as the served entries hold it.

``loadtest.bench.inprocess_jpeg`` runs them over flavours and batch sizes and reports them;
``loadtest.bench.jpeg_reference`` runs ``overlapped`` beside the served path.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FLAVOURS",
    "BatchStream",
    "VARIANTS",
    "classifier_file",
    "gil_probe",
    "gil_probes",
    "overlapped",
    "serial",
]

#: the classifier flavours and the file each is served from
FLAVOURS = {"torchscript": "model.pt", "compiled": "exported.pt2"}


def classifier_file(flavour: str, device: Any, folder: Path, max_batch: int) -> Path:
    """efficientnet_lite0 written as the served entries hold it: a TorchScript trace (FP32, converted
    at load) or a ``torch.export`` program of the FP16 channels_last module (as ``builders/compiled.py``
    exports it)."""
    import torch

    from builders.families.efficientnet import EfficientNetLite0

    module, _ = EfficientNetLite0().load()
    path = folder / FLAVOURS[flavour]
    example = torch.zeros(2, 3, 224, 224)
    if flavour == "torchscript":
        with torch.inference_mode():
            torch.jit.trace(module.eval(), (example,), check_trace=False).save(str(path))
        return path
    gpu = device.type == "cuda"
    model = module.to(device).to(torch.float16 if gpu else torch.float32).eval()
    example = example.to(device).to(torch.float16 if gpu else torch.float32)
    if gpu:
        model = model.to(memory_format=torch.channels_last)
        example = example.contiguous(memory_format=torch.channels_last)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with torch.no_grad():
        exported = torch.export.export(
            model, (example,), dynamic_shapes=({0: batch},), strict=False
        )
    with (
        warnings.catch_warnings()
    ):  # partial views of FP16 channels_last weights (see builders/compiled.py)
        warnings.filterwarnings(
            "ignore", message="No complete tensor found in the group", category=UserWarning
        )
        torch.export.save(exported, str(path))
    return path


def _batches(encoded: Sequence[Any], batch: int, count: int) -> list[list[Any]]:
    """``count`` batches of ``batch`` images cycling through ``encoded``, each batch starting where the
    last stopped (so every batch mixes the photos' sizes alike)."""
    return [[encoded[(b * batch + i) % len(encoded)] for i in range(batch)] for b in range(count)]


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def serial(
    model: Any, p: Any, device: Any, encoded: Sequence[Any], batch: int, count: int
) -> dict[str, Any]:
    """Images/s with every step of a batch after the last one's, waiting for the GPU each batch; the
    mean ms per batch of each step."""
    import torch

    from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec
    from serving.gpu_images import decode, host_bytes, preprocess_into, read_header
    from serving.gpu_overlap import TopK

    dtype = torch.float16 if device.type == "cuda" else torch.float32
    runner = BatchRunner(TopK(model), [InputSpec((3, p.size, p.size), dtype)], device, (batch,))
    steps: dict[str, list[float]] = {"headers": [], "decode": [], "resize_model_copy": []}
    batches = _batches(encoded, batch, count + 2)
    started = 0.0
    for b, items in enumerate(batches):
        if b == 2:  # two warm-up batches
            _sync(device)
            started = time.perf_counter()
        t0 = time.perf_counter()
        headers = [read_header(host_bytes(e), p) for e in items]
        t1 = time.perf_counter()
        images = decode(items, headers, device).images
        _sync(device)
        t2 = time.perf_counter()
        with torch.inference_mode():
            outputs = runner.run(
                batch,
                lambda rows, images=images: preprocess_into(images, rows[0], p),  # type: ignore[misc]
            )
            runner.to_host(outputs)
        t3 = time.perf_counter()
        if b >= 2:
            for key, value in (
                ("headers", t1 - t0),
                ("decode", t2 - t1),
                ("resize_model_copy", t3 - t2),
            ):
                steps[key].append(value * 1000.0)
    elapsed = time.perf_counter() - started
    return {
        "images_per_s": count * batch / elapsed,
        "ms_per_batch": {k: float(np.mean(v)) for k, v in steps.items()},
        "batches": count,
    }


#: the overlapped pipeline's variants: keyword arguments of :func:`overlapped`
VARIANTS: dict[str, dict[str, Any]] = {
    "overlapped": {},
    "switch_0.5ms": {"switch_interval_ms": 0.5},
}


@dataclass(frozen=True)
class BatchStream:
    """``count`` batches of ``batch`` images cycling through ``encoded`` (see :func:`_batches`)."""

    encoded: Sequence[Any]
    batch: int
    count: int


def overlapped(
    model: Any,
    p: Any,
    device: Any,
    stream: BatchStream,
    *,
    timing: bool = False,
    switch_interval_ms: float = 0.0,
) -> dict[str, Any]:
    """Images/s of :class:`OverlappedPipeline` over ``stream.count`` batches (after a warm-up of 3)
    and the median ms per batch of each step. ``switch_interval_ms`` > 0 sets the interpreter's GIL switch
    interval for the measurement (``sys.setswitchinterval``; 5 ms by default): how long the decode
    thread may wait for the GIL behind the thread that launches the GPU work."""
    import torch

    from serving.gpu_overlap import OverlappedPipeline, PipelineOptions, TopK

    encoded, batch, count = stream.encoded, stream.batch, stream.count
    default_switch = sys.getswitchinterval()
    if switch_interval_ms > 0:
        sys.setswitchinterval(switch_interval_ms / 1000.0)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    try:
        with OverlappedPipeline(
            TopK(model), p, device, (batch,), PipelineOptions(dtype=dtype, timing=timing)
        ) as pipeline:
            for _ in pipeline.map(_batches(encoded, batch, 3)):
                pass
            _sync(device)
            steps: dict[str, list[float]] = {}
            started = time.perf_counter()
            images = 0
            for result in pipeline.map(_batches(encoded, batch, count)):
                images += len(result.rows)
                for key, value in result.steps_ms.items():
                    steps.setdefault(key, []).append(value)
            elapsed = time.perf_counter() - started
    finally:
        sys.setswitchinterval(default_switch)
    return {
        "images_per_s": images / elapsed,
        "ms_per_batch": {k: float(np.median(v)) for k, v in steps.items()},
        "batches": count,
        "timing": timing,
        "switch_interval_ms": switch_interval_ms or default_switch * 1000.0,
    }


def gil_probe(decode_batch: Callable[[], object], seconds: float = 1.0) -> dict[str, float]:
    """Whether decoding in one thread lets Python run in another: a pure-Python loop's rate while a
    worker thread calls ``decode_batch`` over its rate alone (1.0: the call holds no GIL while it
    works), and the worker's batches/s beside that loop and alone (how long the decode thread waits
    for the GIL behind a busy thread)."""
    decode_batch()

    def loop_rate(until: float) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() < until:
            n += 1
        return n / (time.perf_counter() - t0)

    def decoder(until: float, done: list[int]) -> threading.Thread:
        def work() -> None:
            while time.perf_counter() < until:
                decode_batch()
                done[0] += 1

        return threading.Thread(target=work)

    alone = max(loop_rate(time.perf_counter() + seconds) for _ in range(2))
    solo: list[int] = [0]
    worker = decoder(time.perf_counter() + seconds, solo)
    worker.start()
    worker.join()  # the main thread waits without the GIL
    beside: list[int] = [0]
    worker = decoder(time.perf_counter() + seconds, beside)
    worker.start()
    rate = loop_rate(time.perf_counter() + seconds)
    worker.join()
    return {
        "loop_rate_alone": alone,
        "loop_rate_while_decoding": rate,
        "ratio": rate / alone if alone else 0.0,
        "decode_batches_per_s_alone": solo[0] / seconds,
        "decode_batches_per_s_beside_loop": beside[0] / seconds,
    }


def gil_probes(encoded: Sequence[Any], batch: int, device: Any) -> dict[str, dict[str, float]]:
    """:func:`gil_probe` for ``gpu_images.decode`` (torchvision's list call) on one batch."""
    from serving.gpu_images import Preprocessing, decode, host_bytes, read_header

    p = Preprocessing()
    items = _batches(encoded, batch, 1)[0]
    headers = [read_header(host_bytes(e), p) for e in items]
    return {"gpu_images.decode": gil_probe(lambda: decode(items, headers, device))}
