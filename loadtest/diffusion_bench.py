"""Stable Diffusion through Triton vs diffusers' own ``StableDiffusionPipeline``, same device, same seeds.

    python -m loadtest.diffusion_bench --preset sd15 --device cuda --out benchmarks/h200/diffusion
    python -m loadtest.diffusion_bench --preset tiny --device cpu --sizes 64x64:4,96x96:6 \\
        --concurrency 1,2 --rounds 1 --out /tmp/sd-bench          # the same code path, small, on a CPU

Writes (or takes, ``--checkpoint``) a diffusers checkpoint folder, builds ``stable_diffusion_torch``
from it with the builders exactly as from a real checkpoint, serves it with the embedded Triton, and
then runs diffusers' pipeline on the same device in this process (FP16 on CUDA, FP32 on a CPU).
For each size/steps: ``c`` concurrent Triton clients (gRPC, ``rounds`` requests each, closed loop)
against one pipeline call with a batch of ``c`` prompts (``rounds`` calls); seconds per image and
images per second; the first request at a new size (after the sizes before it); the image
difference (max abs error in 0-255 and PSNR) between Triton and diffusers for the same seeds, alone
and batched; Triton's own statistics (executions vs requests: the batching) and the pipeline
model's log of where each loop's time went. Prints a table, writes ``bench.json`` and ``bench.png``.

Why not :mod:`loadtest.loadgen`: it measures a time window of many short requests. A generation
takes seconds, so a window holds a handful, and a closed loop cut at the window's edge wastes most
of a batch; this benchmark sends a fixed number of requests per client and times the whole, with
plain concurrent tritonclient calls (one gRPC client per thread).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadtest.diffusion_points import Point, psnr, summary_lines, target_lines
from loadtest.diffusion_systems import BASE_SEED, NEGATIVE, PROMPT, DiffusersSystem, TritonSystem
from serving.console import make_console, print_table

if TYPE_CHECKING:
    from rich.console import Console

    from serving.launcher import TritonServer

__all__ = [
    "BASE_SEED",
    "DiffusersSystem",
    "NEGATIVE",
    "PROMPT",
    "Point",
    "add_checkpoint_arguments",
    "build_parser",
    "machine_info",
    "parse_sizes",
    "prepare_checkpoint",
    "psnr",
    "run",
]


def parse_sizes(raw: str) -> list[tuple[int, int, int]]:
    out = []
    for item in raw.split(","):
        size, steps = item.split(":")
        width, height = size.split("x")
        out.append((int(height), int(width), int(steps)))
    return out


def measure(
    system: Any,
    sizes: list[tuple[int, int, int]],
    concurrency: list[int],
    rounds: int,
    log: Callable[[str], None],
    server: Any = None,
) -> dict[str, Any]:
    """Every size and concurrency on one system, the first request at each new size, images kept."""
    points: list[Point] = []
    firsts: list[dict[str, Any]] = []
    images: dict[str, np.ndarray] = {}
    order = [*sizes, sizes[0]] if len(sizes) > 1 else sizes
    for index, (height, width, steps) in enumerate(order):
        label = f"{width}x{height}"
        if index > 0:  # the first request after a change of size
            previous = order[index - 1]
            _, latencies = system.generate(height, width, steps, [BASE_SEED])
            firsts.append(
                {
                    "size": label,
                    "steps": steps,
                    "after": f"{previous[1]}x{previous[0]}",
                    "seconds": latencies[0],
                }
            )
            log(
                f"{system.name}: first request at {label} after {previous[1]}x{previous[0]}: "
                f"{latencies[0]:.3f} s"
            )
        if index == len(sizes):
            break  # back at the first size: only its first request is wanted
        for c in concurrency:
            before = system.statistics() if server is not None else {}
            seen = len(list(server.iter_log())) if server is not None else 0
            batch, latencies, wall = system.run(height, width, steps, c, rounds)
            point = Point(system.name, label, steps, c, c * rounds, wall, latencies)
            if server is not None:
                point.stats, point.loops = system.settled(before, c * rounds, seen)
            points.append(point)
            for k, image in enumerate(batch):
                images[f"{label}/{steps}/c{c}/seed{BASE_SEED + k}"] = image
            log(
                f"{system.name}: {label} {steps} steps, {c} concurrent x {rounds}: "
                f"{point.seconds_per_image:.3f} s/image, {point.images_per_s:.3f} images/s"
            )
    return {"points": points, "firsts": firsts, "images": images}


def machine_info(device: str) -> dict[str, str]:
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        from importlib.metadata import version

        info["diffusers"] = version("diffusers")
        info["transformers"] = version("transformers")
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    return info


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The options :func:`prepare_checkpoint` reads, and ``--device``."""
    parser.add_argument(
        "--checkpoint", type=Path, help="a diffusers checkpoint folder (default: write --preset)"
    )
    parser.add_argument(
        "--preset", default="sd15", help="random-init checkpoint to write: sd15 or tiny"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--device", default="cuda", help="cuda or cpu: where everything runs and weights are drawn"
    )


def prepare_checkpoint(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> Path:
    from builders.families.diffusion import write_random_checkpoint

    if args.checkpoint is not None:
        return Path(args.checkpoint)
    started = time.perf_counter()
    target = workdir / f"{args.preset}-random"
    try:
        path = write_random_checkpoint(target, args.preset, args.seed, args.device)
    except (
        RuntimeError
    ) as exc:  # weights drawn on a GPU are only faster; the CPU draws the same model
        log(f"drawing the weights on {args.device} failed ({exc}); drawing them on the CPU")
        path = write_random_checkpoint(target, args.preset, args.seed, "cpu")
    log(
        f"wrote the {args.preset} random-init checkpoint (seed {args.seed}, drawn on {args.device}) in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return path


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench diffusion``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for bench.json, bench.png, bench.txt"
    )
    add_checkpoint_arguments(parser)
    parser.add_argument(
        "--sizes",
        default="512x512:25,768x768:50",
        help="WIDTHxHEIGHT:STEPS, comma separated, in order",
    )
    parser.add_argument(
        "--concurrency", default="1,4,8", help="concurrent requests (diffusers: batch sizes)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="requests per client (diffusers: calls per batch size)",
    )
    parser.add_argument(
        "--stall-s",
        type=float,
        default=0.5,
        help="extra seconds the first request at a new size may take",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="also: max concurrency at the first size, four schedulers",
    )
    parser.add_argument(
        "--stub-python", help="interpreter whose environment Triton's Python models use"
    )
    parser.add_argument(
        "--workdir", type=Path, help="checkpoint and repository folder (default: a temporary one)"
    )
    return parser


Log = Callable[[str], None]


def _plain_log(console: Console) -> Log:
    """Messages printed on ``console`` as they are (no markup, no highlighting)."""
    return lambda message: console.print(message, markup=False, highlight=False)


def _build_pipeline(workdir: Path, checkpoint: Path, log: Log) -> dict[str, Any]:
    """Build the Triton pipeline entry from ``checkpoint`` into ``workdir/repository``; how it went."""
    from builders.families.diffusion import PIPELINE, TORCH_PIPELINE
    from builders.pipeline import BuildOptions, build

    started = time.perf_counter()
    reports = build(
        [TORCH_PIPELINE],
        BuildOptions(repository=workdir / "repository", weights={PIPELINE: str(checkpoint)}),
    )
    entry = next(r for r in reports if r.model == TORCH_PIPELINE)
    built = {
        "seconds": time.perf_counter() - started,
        "precision": entry.precision,
        "parity": entry.parity,
        "notes": entry.notes,
    }
    log(f"built {TORCH_PIPELINE} ({entry.precision}) in {built['seconds']:.1f} s")
    return built


def _mixed_schedulers(
    ours: TritonSystem, server: TritonServer, size: tuple[int, int, int], c: int, log: Log
) -> dict[str, Any]:
    """``c`` concurrent requests at ``size`` with four schedulers side by side."""
    height, width, steps = size
    before, seen = ours.statistics(), len(list(server.iter_log()))
    _, latencies, wall = ours.run(
        height, width, steps, c, 1, ("", "euler", "dpmpp_2m", "euler_ancestral")
    )
    stats, loops = ours.settled(before, c, seen)
    log(f"triton: {c} concurrent, four schedulers side by side: {c / wall:.3f} images/s")
    return {
        "size": f"{width}x{height}",
        "steps": steps,
        "concurrency": c,
        "wall_s": wall,
        "images_per_s": c / wall,
        "latencies_s": latencies,
        "stats": stats,
        "loops": loops,
    }


def _measure_triton(
    args: argparse.Namespace,
    workdir: Path,
    plan: tuple[list[tuple[int, int, int]], list[int]],
    log: Log,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Serve the built entry with Triton and measure every point of ``plan`` (sizes, concurrency)
    there; also its load time and ``--mixed``'s run, for the document's ``extra``."""
    from builders.families.diffusion import TORCH_PIPELINE
    from serving.launcher import TritonPorts, TritonServer, TritonStartError

    sizes, concurrency = plan
    started = time.perf_counter()
    server = TritonServer(
        workdir / "repository",
        models=[TORCH_PIPELINE],
        ports=TritonPorts.free(),
        python=args.stub_python,
        startup_timeout_s=600,
    )
    try:
        server.start()
    except TritonStartError:
        log("Triton did not start; the end of its log:\n" + server.log_tail(150))
        raise
    try:
        figures: dict[str, Any] = {"triton_load_s": time.perf_counter() - started}
        log(
            f"Triton ready with {TORCH_PIPELINE} in {figures['triton_load_s']:.1f} s (weights "
            "loaded, warmed up)"
        )
        ours = TritonSystem(server, TORCH_PIPELINE, max(concurrency))
        triton = measure(ours, sizes, concurrency, args.rounds, log, server)
        if args.mixed:
            figures["mixed_schedulers"] = _mixed_schedulers(
                ours, server, sizes[0], max(concurrency), log
            )
        return triton, figures
    finally:
        server.stop()


def _measure_diffusers(
    args: argparse.Namespace,
    checkpoint: Path,
    plan: tuple[list[tuple[int, int, int]], list[int]],
    log: Log,
) -> dict[str, Any]:
    """diffusers' own pipeline in this process at every point of ``plan``."""
    sizes, concurrency = plan
    theirs = DiffusersSystem(checkpoint, args.device)
    theirs.call(sizes[0][0], sizes[0][1], 2, [BASE_SEED])  # warm-up, as Triton's model does at load
    return measure(theirs, sizes, concurrency, args.rounds, log)


def _report(
    args: argparse.Namespace,
    config: dict[str, Any],
    measured: tuple[dict[str, Any], dict[str, Any]],
    extra: dict[str, Any],
    console: Console,
) -> None:
    """Print the table and write ``bench.txt``, ``bench.json`` and ``bench.png`` into ``--out``."""
    from loadtest import diffusion_report as report

    log = _plain_log(console)
    triton, diffusers = measured
    extra["parity"] = report.parity(triton, diffusers)
    extra["targets"] = report.targets(triton, diffusers, args.stall_s)
    table = report.speed_table(triton, diffusers, config["machine"].get("gpu", args.device))
    parity = [
        f"  {p['image']}: max abs {p['max_abs_error']}, mean abs {p['mean_abs_error']:.3f}, PSNR "
        f"{p['psnr_db']:.1f} dB"
        for p in extra["parity"]
    ]
    firsts = [
        f"  {name}: {f['after']} -> {f['size']} ({f['steps']} steps): {f['seconds']:.3f}"
        for name, result in (("triton", triton), ("diffusers", diffusers))
        for f in result["firsts"]
    ]
    lines = summary_lines(
        table.plain(),
        {
            "Image difference, Triton vs diffusers, same seed (0-255 scale):": parity,
            "First request after a change of size (seconds):": firsts,
            "Targets:": target_lines(extra["targets"]),
        },
    )
    print_table(table, console)
    for line in lines[1:]:
        log(line)
    (args.out / "bench.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report.write_json(args.out / "bench.json", config, triton, diffusers, extra)
    report.write_plot(args.out / "bench.png", triton, diffusers)
    log(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.png'}, {args.out / 'bench.txt'}")


def run(args: argparse.Namespace) -> int:
    """``inferctl bench diffusion``: the parsed options in, the exit status out."""
    console = make_console()
    log = _plain_log(console)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = parse_sizes(args.sizes), [int(c) for c in args.concurrency.split(",")]
    extra: dict[str, Any] = {}
    folder = (  # a temporary one is removed after the run
        tempfile.TemporaryDirectory(prefix="diffusion-bench-")
        if args.workdir is None
        else contextlib.nullcontext(str(args.workdir))
    )
    with folder as name:
        workdir = Path(name)
        config = {
            **vars(args),
            "out": str(args.out),
            "checkpoint": str(args.checkpoint),
            "workdir": str(workdir),
            "prompt": PROMPT,
            "negative_prompt": NEGATIVE,
            "base_seed": BASE_SEED,
            "machine": machine_info(args.device),
        }
        checkpoint = prepare_checkpoint(args, workdir, log)
        extra["build"] = _build_pipeline(workdir, checkpoint, log)
        triton, figures = _measure_triton(args, workdir, plan, log)
        extra.update(figures)
        diffusers = _measure_diffusers(args, checkpoint, plan, log)
    _report(args, config, (triton, diffusers), extra, console)
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("diffusion"))
