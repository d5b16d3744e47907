"""The in-process JPEG pipeline, three ways, in one process and no server: the served path's reference.

- ``serial``: each batch's steps one after another (headers, decode, resize, classifier, copy back),
  the host waiting for the GPU at the end of every batch;
- ``pipelined`` (GPU only): what ``image_classifier_gpu`` does with ``pipeline_chunk``, measured by
  :func:`loadtest.bench.gpu_raw.jpeg_profile`, with its per-step split;
- ``overlapped``: :class:`serving.gpu_overlap.OverlappedPipeline`, decode of batch n + 1 in a worker
  thread while batch n is resized and classified on their own streams; beside it the variants of
  :data:`VARIANTS` (a 0.5 ms GIL switch interval), each the median of ``--repeats`` interleaved
  runs, and one run with CUDA events for the per-step GPU time.

Each figure is images/s over a stream of batches of the sample JPEGs (``loadtest.payloads``, or
the ``.jpg`` files of ``--jpeg-dir``) after a warm-up. The classifier is efficientnet_lite0 as served:
TorchScript (``model.pt``) or the compiled flavour (``exported.pt2``, ``torch.compile`` at load),
FP16 channels_last as CUDA graphs on the GPU, FP32 eager on the CPU.

Also measured (:func:`gil_probe`): whether a thread decoding with nvJPEG lets Python run in another,
and how fast it decodes beside a busy Python thread (torchvision's list call).

``python -m loadtest.bench.inprocess_jpeg --out DIR`` prints the table and writes
``DIR/inprocess_jpeg.json`` (and ``.txt``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench.inprocess_measure import (
    FLAVOURS,
    VARIANTS,
    BatchStream,
    classifier_file,
    gil_probes,
    overlapped,
    serial,
)
from loadtest.registry import UsageError

__all__ = ["InprocessSettings", "build_parser", "format_table", "inprocess_jpeg", "run"]


def _log(message: str) -> None:
    print(f"[inprocess-jpeg] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class InprocessSettings:
    """What :func:`inprocess_jpeg` measures: on ``device_name``, each classifier flavour at each batch
    size, ``count`` batches per measurement, each overlapped variant ``repeats`` times (GPU)."""

    device_name: str
    flavours: Sequence[str]
    batches: Sequence[int]
    count: int
    repeats: int = 3


def inprocess_jpeg(
    settings: InprocessSettings,
    jpegs: Sequence[bytes],
    workdir: Path,
    checkpoint: Callable[[dict[str, Any]], object] | None = None,
) -> dict[str, Any]:
    """Every figure of the module's docstring, per classifier flavour and batch size; on the GPU each
    overlapped variant (:data:`VARIANTS`) is measured ``settings.repeats`` times, interleaved, and its
    median reported (with every run's figure). ``checkpoint`` gets the document after each run (a run
    cut short keeps what it measured)."""
    device_name, flavours, batches = settings.device_name, settings.flavours, settings.batches
    count, repeats = settings.count, settings.repeats
    import torch

    from loadtest.bench.report import machine_description
    from serving.backends.pytorch.torch_module import TorchModule
    from serving.image_preprocessing import Preprocessing

    device = torch.device(device_name)
    gpu = device.type == "cuda"
    if gpu:
        torch.backends.cudnn.benchmark = False  # as the serving backend
    p = Preprocessing()  # efficientnet_lite0's: 224 px from 256, mean = std = 0.5
    encoded = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
    document: dict[str, Any] = {
        "machine": machine_description(),
        "device": device_name,
        "photos": len(jpegs),
        "photo_bytes": sum(len(j) for j in jpegs),
        "runs": [],
    }
    if gpu:
        document["gil"] = gil_probes(encoded, max(batches), device)
        _log(f"GIL while decoding: {document['gil']}")
    variants = VARIANTS if gpu else {"overlapped": {}}
    for flavour in flavours:
        started = time.perf_counter()
        path = classifier_file(flavour, device, workdir, max(batches))
        model = TorchModule(
            str(path), device, torch.float16 if gpu else torch.float32, gpu, [torch.float32]
        )
        _log(f"{flavour} classifier ready in {time.perf_counter() - started:.0f} s")
        for batch in batches:
            run: dict[str, Any] = {"classifier": flavour, "batch": batch}
            run["serial"] = serial(model, p, device, encoded, batch, count)
            if gpu:
                from loadtest.bench.gpu_raw import jpeg_profile

                run["profile"] = jpeg_profile(path, jpegs, batch)
            tries: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
            for _ in range(repeats if gpu else 1):
                for name, kwargs in variants.items():
                    tries[name].append(
                        overlapped(model, p, device, BatchStream(encoded, batch, count), **kwargs)
                    )
            for name, measured in tries.items():
                rates = [m["images_per_s"] for m in measured]
                run[name] = {
                    **measured[0],
                    "images_per_s": float(np.median(rates)),
                    "all_images_per_s": rates,
                }
            if gpu:
                run["overlapped_timed"] = overlapped(
                    model, p, device, BatchStream(encoded, batch, count), timing=True
                )
            _log(
                f"{flavour} b{batch}: "
                + ", ".join(
                    f"{name} {run[name]['images_per_s']:,.0f}/s" for name in ("serial", *variants)
                )
            )
            document["runs"].append(run)
            if checkpoint is not None:
                checkpoint(document)
            if gpu:
                torch.cuda.empty_cache()
    return document


def format_table(document: dict[str, Any]) -> str:
    """The document's figures as a plain-text table."""
    gpu = document["machine"].get("gpu", "CPU") if document["device"].startswith("cuda") else "CPU"
    names = [n for n in VARIANTS if any(n in run for run in document["runs"])]
    lines = [
        f"in-process JPEG -> top-5, {gpu}, {document['photos']} sample photos "
        f"({document['photo_bytes'] / document['photos'] / 1000:.0f} KB mean); images/s "
        "(overlapped variants: median of the runs)",
        f"{'classifier':<12} {'batch':>5} {'serial':>8} {'profiled':>8} {'pipelined':>9} "
        + " ".join(f"{n:>13}" for n in names)
        + f" {'x serial':>8}",
    ]
    for run in document["runs"]:
        profile = run.get("profile", {})
        best_serial = max(run["serial"]["images_per_s"], profile.get("serial_images_per_s", 0.0))
        rate = run["overlapped"]["images_per_s"]
        lines.append(
            f"{run['classifier']:<12} {run['batch']:>5} {run['serial']['images_per_s']:>8,.0f} "
            f"{profile.get('serial_images_per_s', 0.0):>8,.0f} "
            f"{profile.get('pipelined_images_per_s', 0.0):>9,.0f} "
            + " ".join(f"{run[n]['images_per_s']:>13,.0f}" for n in names)
            + f" {rate / best_serial if best_serial else 0.0:>8.2f}"
        )
        steps = profile.get("ms_per_batch") or run["serial"]["ms_per_batch"]
        lines.append(
            "    ms per batch, serial: " + " + ".join(f"{k} {v:.2f}" for k, v in steps.items())
        )
        timed = run.get("overlapped_timed", {}).get("ms_per_batch", {})
        if timed:
            lines.append(
                "    ms per batch, overlapped (decode thread wall; GPU time of resize, model): "
                + ", ".join(f"{k} {v:.2f}" for k, v in timed.items())
            )
    for decoder, gil in document.get("gil", {}).items():
        lines.append(
            f"GIL, {decoder}: a Python loop runs at {gil['ratio']:.2f}x its rate alone while another thread "
            f"decodes; that thread decodes {gil['decode_batches_per_s_beside_loop']:.0f} batches/s "
            f"beside the loop, {gil['decode_batches_per_s_alone']:.0f}/s alone"
        )
    return "\n".join(lines)


def _read_jpegs(folder: Path | None) -> tuple[bytes, ...]:
    if folder is None:
        from loadtest.payloads import jpeg_images

        return jpeg_images()
    files = sorted(folder.glob("*.jpg"))
    if not files:
        raise SystemExit(f"no .jpg files in {folder}")
    return tuple(f.read_bytes() for f in files)


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench inprocess-jpeg``'s options."""
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default: cuda)")
    parser.add_argument(
        "--flavours", default="compiled,torchscript", help="classifiers: compiled, torchscript"
    )
    parser.add_argument(
        "--batches", default="128", help="batch sizes, comma-separated (default: 128)"
    )
    parser.add_argument(
        "--count", type=int, default=60, help="batches per measurement (default: 60)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each overlapped variant (default: 3)"
    )
    parser.add_argument(
        "--jpeg-dir",
        type=Path,
        default=None,
        help="a folder of .jpg files to send (default: the sample photos of loadtest.payloads)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="folder for inprocess_jpeg.json and .txt"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench inprocess-jpeg``: the parsed options in, the exit status out."""
    flavours = [f.strip() for f in args.flavours.split(",") if f.strip()]
    unknown = [f for f in flavours if f not in FLAVOURS]
    if unknown:
        raise UsageError(f"unknown flavours {unknown}: expected {', '.join(FLAVOURS)}")
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    args.out.mkdir(parents=True, exist_ok=True)

    def save(document: dict[str, Any]) -> str:
        table = format_table(document)
        (args.out / "inprocess_jpeg.json").write_text(
            json.dumps(document, indent=2, default=float) + "\n", encoding="utf-8"
        )
        (args.out / "inprocess_jpeg.txt").write_text(table + "\n", encoding="utf-8")
        return table

    with tempfile.TemporaryDirectory(prefix="inprocess-jpeg-") as tmp:
        document = inprocess_jpeg(
            InprocessSettings(args.device, flavours, batches, args.count, args.repeats),
            _read_jpegs(args.jpeg_dir),
            Path(tmp),
            save,
        )
    print(save(document))
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("inprocess-jpeg"))
