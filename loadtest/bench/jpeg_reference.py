"""The served JPEG path's reference, measured in the same GPU run: the overlapped in-process pipeline.

Issue 28 asks the served path for >= 80% of what one process does with decode, resize and the
classifier overlapped (``serving.gpu_overlap``). :func:`jpeg_overlapped` measures that pipeline on
the very classifier file a served entry loads, so the two figures come from one card and one run;
``loadtest.bench.inprocess_jpeg`` measures more of it (serial steps, GIL probes, variants).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from loadtest.bench.inprocess_measure import BatchStream, overlapped
from loadtest.bench.settings import Result

__all__ = ["INPROCESS_OVERLAPPED", "jpeg_overlapped"]

#: the rows' name (not "jpeg ...": those are the served configurations)
INPROCESS_OVERLAPPED = "in-process jpeg overlapped"


def jpeg_overlapped(
    model_file: Path,
    jpegs: Sequence[bytes],
    batches: Sequence[int],
    count: int = 40,
    repeats: int = 3,
) -> list[Result]:
    """One row per batch size: the median of ``repeats`` runs of ``count`` batches, in images/s
    (latency columns: one batch's share of the time, batch / rate)."""
    import torch

    from serving.backends.pytorch.torch_module import TorchModule
    from serving.image_preprocessing import Preprocessing

    device = torch.device("cuda")
    model = TorchModule(str(model_file), device, torch.float16, True, [torch.float32])
    encoded = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
    rows: list[Result] = []
    for batch in batches:
        rates = sorted(
            overlapped(model, Preprocessing(), device, BatchStream(encoded, batch, count))[
                "images_per_s"
            ]
            for _ in range(repeats)
        )
        rate = rates[len(rates) // 2]
        per_batch_ms = batch / rate * 1000.0
        rows.append(
            Result(
                config=INPROCESS_OVERLAPPED,
                concurrency=0,
                requests=count * batch * repeats,
                errors=0,
                duration_s=sum(count * batch / r for r in rates),
                throughput=rate,
                p50_ms=per_batch_ms,
                p95_ms=per_batch_ms,
                p99_ms=per_batch_ms,
                mean_ms=per_batch_ms,
                batch=batch,
                note=f"{model_file.name}: decode overlapped with resize + model, median of "
                f"{repeats} x {count} batches ({', '.join(f'{r:,.0f}' for r in rates)}/s)",
            )
        )
        torch.cuda.empty_cache()
    return rows
