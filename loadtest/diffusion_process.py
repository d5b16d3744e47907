"""Stable Diffusion on one GPU in a fixed time: the served pipeline's code vs diffusers, same seeds.

    python -m loadtest.diffusion_process --out OUT --budget-s 100          # a GPU host: sd15, FP16
    python -m loadtest.diffusion_process --out OUT --preset tiny --device cpu \\
        --sizes 64x64:3,96x96:4 --concurrency 1,2 --switch 96x96:3         # the same path on a CPU

What runs: a random-init checkpoint folder is written (``--preset``, as diffusers writes real ones),
``stable_diffusion_torch`` is built from it by the builders (FP16 weights, checked, on a GPU host)
and its model code, :class:`~builders.python_models.diffusion_runtime.PipelineRuntime` (tokenizer,
diffusers' schedulers, the batched loop, the networks in FP16 on the GPU), is called in this process
as the Triton model calls it: ``c`` concurrent requests are ``c`` rows of one loop, as Triton's
dynamic batcher hands them over. Triton itself (server, transport, tensor copies) is not in these
figures: ``loadtest.diffusion_bench`` measures through a real Triton where one can run.
Against it: diffusers' ``StableDiffusionPipeline`` from the same folder, same precision and device,
one call with a batch of ``c`` prompts, the same CPU-generator seeds.

Within ``--budget-s`` (counted from this process's start), the points run in priority order: the
first size alone (speed and the image difference), batched, the first request at a size not run
before, right after a call at the first size (then a second one there: the stall is the difference),
the second size, the larger batches. Each system is brought to a point's batch shape by an untimed
call of a few steps before it is timed (the two systems share one CUDA allocator). Each is
estimated from the seconds per image-step measured so far; a point that would not fit is a row that
says so, never a figure. ``bench.json`` and ``bench.txt`` are rewritten after every point, so a run
that is cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.diffusion_bench import (
    add_checkpoint_arguments,
    machine_info,
    parse_sizes,
    prepare_checkpoint,
)
from loadtest.diffusion_process_report import Measured, write_results
from loadtest.diffusion_systems import BASE_SEED, NEGATIVE, PROMPT, DiffusersSystem
from loadtest.options import settings_record
from serving.console import make_console

__all__ = ["Budget", "ServedSystem", "build_parser", "plan", "run"]

#: estimates are scaled up by this much (attention grows faster than the pixel count)
MARGIN = 1.5
#: seconds kept for writing the results at the end
RESERVE_S = 3.0


class Budget:
    """Seconds left of the run's budget (0: no budget, everything fits)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()

    def left(self) -> float:
        return math.inf if self.seconds <= 0 else self.seconds - (time.monotonic() - self.started)

    def fits(self, estimate_s: float) -> bool:
        return estimate_s + RESERVE_S <= self.left()


class ServedSystem:
    """The built ``stable_diffusion_torch`` entry's model code, in this process."""

    name = "served"

    def __init__(self, entry: Path, device: str, warmup_steps: int = 2) -> None:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc

        from builders.python_models.diffusion_runtime import PipelineRuntime, torch_networks

        config = text_format.Parse(
            (entry.parent / "config.pbtxt").read_text(encoding="utf-8"), mc.ModelConfig()
        )
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        networks = torch_networks(str(entry), parameters, gpu=device.startswith("cuda"))
        self.runtime = PipelineRuntime(str(entry), parameters, networks)
        self.precision = parameters.get("precision", "fp32")
        self.runtime.warm_up(warmup_steps)  # as the model does at load

    def call(
        self, height: int, width: int, steps: int, seeds: list[int]
    ) -> tuple[list[np.ndarray], float]:
        from builders.python_models.diffusion_request import Request

        rows: list[tuple[Hashable, Request]] = [
            (
                k,
                Request(
                    PROMPT,
                    NEGATIVE,
                    steps=steps,
                    guidance=7.5,
                    height=height,
                    width=width,
                    seed=seed,
                ),
            )
            for k, seed in enumerate(seeds)
        ]
        images: dict[Hashable, np.ndarray] = {}

        def done(keys: list[Hashable], batch: Any) -> None:
            images.update({key: image.numpy() for key, image in zip(keys, batch, strict=True)})

        started = time.perf_counter()
        self.runtime.generate(rows, done)  # returns once every image is on the CPU
        seconds = time.perf_counter() - started
        return [images[k] for k in range(len(seeds))], seconds


@dataclass(frozen=True)
class Point:
    height: int
    width: int
    steps: int
    concurrency: int
    switch: bool = False  # the first request at this size after another, then a steady one
    came_from: tuple[int, int] | None = None  # a switch point's previous size (height, width)

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"


def plan(
    sizes: Sequence[tuple[int, int, int]],
    concurrency: Sequence[int],
    switch: tuple[int, int, int] | None,
) -> list[Point]:
    """The points in priority order (see the module's docstring)."""
    first, rest = sizes[0], list(sizes[1:])
    if switch is not None and switch[:2] == first[:2]:
        # The switch point runs right after the first size's points: it must be a size not run before,
        # or its "first request" would find everything warm.
        raise ValueError(
            f"--switch {switch[1]}x{switch[0]} must be a size other than the first of --sizes"
        )
    alone, batched = [c for c in concurrency if c == 1], [c for c in concurrency if c != 1]
    points = [Point(*first, c) for c in alone + batched[:1]]
    if switch is not None:
        points.append(Point(*switch, 1, switch=True, came_from=(first[0], first[1])))
    points += [Point(*size, c) for size in rest for c in alone]
    points += [Point(*first, c) for c in batched[1:]]
    points += [Point(*size, c) for size in rest for c in batched]
    return points


class _Pace:
    """Seconds per image-step at 512x512-equivalent pixels, the slowest system's, from what was measured
    (until a point is measured: from a short warm-up call, whose text encoding and decoding make it high)."""

    def __init__(self, seconds: float, images: int, point: Point) -> None:
        self.unit, self.from_points = self._unit(seconds, images, point), False

    def learn(self, seconds: float, images: int, point: Point) -> None:
        unit = self._unit(seconds, images, point)
        self.unit = max(self.unit, unit) if self.from_points else unit
        self.from_points = True

    def _unit(self, seconds: float, images: int, point: Point) -> float:
        return seconds / (images * point.steps * self._pixels(point))

    def estimate(self, point: Point, rounds: int, systems: int = 2) -> float:
        calls = 2 if point.switch else rounds
        steps = calls * point.steps + WARMUP_STEPS
        return MARGIN * systems * self.unit * point.concurrency * steps * self._pixels(point)

    @staticmethod
    def _pixels(point: Point) -> float:
        return point.height * point.width / (512 * 512)


#: steps of the untimed call that brings each system to a new (size, concurrency) before it is timed
WARMUP_STEPS = 2


def _run(
    point: Point,
    systems: dict[str, Any],
    rounds: int,
    pace: _Pace,
    images: dict[str, dict[str, np.ndarray]],
    warmed: set[tuple[str, int, int, int]],
) -> Measured:
    measured = Measured(
        point.size,
        point.steps,
        point.concurrency,
        rounds=2 if point.switch else rounds,
        switch=point.switch,
    )
    for name, system in systems.items():
        measured.seconds[name] = []
        shape = (name, point.height, point.width, point.concurrency)
        if not point.switch and shape not in warmed:
            # Both systems share this process's CUDA allocator: without this call, whichever ran first
            # at a new batch shape would pay the allocator's growth for both (a 40% penalty at 512x512,
            # 4 concurrent, in an earlier run). The switch point measures that first call on purpose.
            system.call(point.height, point.width, WARMUP_STEPS, [BASE_SEED] * point.concurrency)
        warmed.add(shape)
        if point.came_from is not None:  # the call right before the timed ones is at the other size
            system.call(*point.came_from, WARMUP_STEPS, [BASE_SEED])
        for r in range(measured.rounds):
            seeds = [BASE_SEED + k + r * point.concurrency for k in range(point.concurrency)]
            out, seconds = system.call(point.height, point.width, point.steps, seeds)
            measured.seconds[name].append(seconds)
            pace.learn(seconds, len(seeds), point)
            if r == 0 and not point.switch:
                for seed, image in zip(seeds, out, strict=True):
                    images[name][f"{point.size}/{point.steps}/c{point.concurrency}/seed{seed}"] = (
                        image
                    )
    return measured


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench diffusion-inprocess``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for bench.json and bench.txt"
    )
    parser.add_argument(
        "--budget-s", type=float, default=0.0, help="seconds for the whole run (0: no limit)"
    )
    add_checkpoint_arguments(parser)
    parser.add_argument(
        "--sizes", default="512x512:25,768x768:50", help="WIDTHxHEIGHT:STEPS, comma separated"
    )
    parser.add_argument(
        "--concurrency", default="1,4,8", help="concurrent requests (diffusers: batch sizes)"
    )
    parser.add_argument(
        "--switch",
        default="768x768:25",
        help="WIDTHxHEIGHT:STEPS of the change-of-size point ('' none)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="calls per point and system (1 where 2 would not fit)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="checkpoint and repository folder (default: a temporary one)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench diffusion-inprocess``: the parsed options in, the exit status out."""
    budget = Budget(args.budget_s)

    from builders.families.diffusion import PIPELINE, TORCH_PIPELINE
    from builders.pipeline import BuildOptions, build

    console = make_console()

    def log(message: str) -> None:
        console.print(
            f"[{time.monotonic() - budget.started:6.1f} s] {message}", markup=False, highlight=False
        )

    args.out.mkdir(parents=True, exist_ok=True)
    sizes = parse_sizes(args.sizes)
    switch = parse_sizes(args.switch)[0] if args.switch else None
    points = plan(sizes, [int(c) for c in args.concurrency.split(",")], switch)
    scratch = (
        tempfile.TemporaryDirectory(prefix="diffusion-process-") if args.workdir is None else None
    )
    workdir = Path(scratch.name) if scratch is not None else args.workdir
    machine = machine_info(args.device)
    config = settings_record(vars(args))
    config.update(
        {
            "prompt": PROMPT,
            "negative_prompt": NEGATIVE,
            "guidance": 7.5,
            "scheduler": "the checkpoint's own",
            "base_seed": BASE_SEED,
            "machine": machine,
        }
    )
    setup: dict[str, Any] = {}
    rows: list[Measured] = []
    images: dict[str, dict[str, np.ndarray]] = {"served": {}, "diffusers": {}}
    device = machine.get("gpu", args.device)
    try:
        checkpoint = timed(setup, "checkpoint", lambda: prepare_checkpoint(args, workdir, log))
        reports = timed(
            setup,
            "build",
            lambda: build(
                [TORCH_PIPELINE],
                BuildOptions(
                    repository=workdir / "repository", weights={PIPELINE: str(checkpoint)}
                ),
            ),
        )
        entry = next(r for r in reports if r.model == TORCH_PIPELINE)
        setup["entry"] = {"precision": entry.precision, "parity": entry.parity}
        log(f"built {TORCH_PIPELINE} ({entry.precision}) in {setup['build']:.1f} s")
        served = timed(
            setup,
            "served_load_and_warm_up",
            lambda: ServedSystem(
                workdir / "repository" / TORCH_PIPELINE / str(entry.version), args.device
            ),
        )
        theirs = timed(setup, "diffusers_load", lambda: DiffusersSystem(checkpoint, args.device))
        timed(
            setup,
            "diffusers_warm_up",
            lambda: theirs.call(sizes[0][0], sizes[0][1], 2, [BASE_SEED]),
        )
        log(f"both systems loaded and warmed up ({budget.left():.0f} s of the budget left)")
        # A second short call, kernels loaded: the first estimate of the pace.
        short = Point(sizes[0][0], sizes[0][1], 2, 1)
        pace = _Pace(
            timed(
                setup,
                "diffusers_pace",
                lambda: theirs.call(short.height, short.width, 2, [BASE_SEED]),
            )[1],
            1,
            short,
        )
        systems = {"served": served, "diffusers": theirs}
        warmed: set[tuple[str, int, int, int]] = set()
        for point in points:
            rounds = next(
                (r for r in range(args.rounds, 0, -1) if budget.fits(pace.estimate(point, r))), 0
            )
            if rounds == 0:
                rows.append(
                    Measured(
                        point.size,
                        point.steps,
                        point.concurrency,
                        switch=point.switch,
                        not_run=f"about {pace.estimate(point, 1):.0f} s needed, {budget.left():.0f} s left",
                    )
                )
                log(f"{point}: not run ({rows[-1].not_run})")
            else:
                rows.append(_run(point, systems, rounds, pace, images, warmed))
                measured = rows[-1]
                log(
                    f"{point}: "
                    + ", ".join(
                        f"{n} {[round(s, 3) for s in secs]}" for n, secs in measured.seconds.items()
                    )
                )
            write_results(args.out, config, rows, images, setup, device)
    finally:
        write_results(args.out, config, rows, images, setup, device)
        if scratch is not None:
            scratch.cleanup()
    console.print(
        (args.out / "bench.txt").read_text(encoding="utf-8"), markup=False, highlight=False
    )
    return 0


def timed(setup: dict[str, Any], name: str, step: Callable[[], Any]) -> Any:
    """``step()``, its seconds recorded in ``setup[name]``."""
    started = time.perf_counter()
    result = step()
    setup[name] = time.perf_counter() - started
    return result


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("diffusion-inprocess"))
