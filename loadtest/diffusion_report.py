"""The diffusion benchmark's results: the table, the targets, ``bench.json`` and ``bench.png``."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtest.diffusion_points import ALONE_RATIO_TARGET, Point, psnr
from loadtest.plotting import saved_figure
from serving.console import Table
from serving.quantiles import quantile

__all__ = ["parity", "speed_table", "targets", "write_json", "write_plot"]


def _pairs(triton: dict[str, Any], diffusers: dict[str, Any]) -> list[tuple[Point, Point]]:
    theirs = {(p.size, p.steps, p.concurrency): p for p in diffusers["points"]}
    return [
        (p, theirs[(p.size, p.steps, p.concurrency)])
        for p in triton["points"]
        if (p.size, p.steps, p.concurrency) in theirs
    ]


def speed_table(triton: dict[str, Any], diffusers: dict[str, Any], device: str) -> Table:
    table = Table(
        f"Stable Diffusion: Triton (stable_diffusion_torch) vs diffusers StableDiffusionPipeline, {device}",
        (
            "size",
            "steps",
            "concurrent / batch",
            "triton s/image",
            "triton images/s",
            "triton p50 latency s",
            "UNet batch (requests/executions)",
            "diffusers s/image",
            "diffusers images/s",
            "time ratio",
        ),
    )
    for ours, theirs in _pairs(triton, diffusers):
        executions = ours.stats.get("executions", 0)
        batch = f"{ours.stats['requests'] / executions:.1f}" if executions else "-"
        table.add_row(
            ours.size,
            ours.steps,
            ours.concurrency,
            f"{ours.seconds_per_image:.3f}",
            f"{ours.images_per_s:.3f}",
            f"{quantile(ours.latencies_s, 0.5):.3f}",
            batch,
            f"{theirs.seconds_per_image:.3f}",
            f"{theirs.images_per_s:.3f}",
            f"{ours.seconds_per_image / theirs.seconds_per_image:.3f}",
        )
    table.caption = (
        "Triton: c gRPC clients, each sending its requests one after another; diffusers: one pipeline "
        "call with a batch of c prompts. s/image = wall time / images; time ratio = Triton / diffusers."
    )
    return table


def parity(triton: dict[str, Any], diffusers: dict[str, Any]) -> list[dict[str, Any]]:
    """Image difference for every seed both produced at the same size, steps and concurrency."""
    rows = []
    for key, ours in sorted(triton["images"].items()):
        theirs = diffusers["images"].get(key)
        if theirs is None:
            continue
        diff = abs(ours.astype(int) - theirs.astype(int))
        rows.append(
            {
                "image": key,
                "max_abs_error": int(diff.max()),
                "mean_abs_error": float(diff.mean()),
                "psnr_db": psnr(ours, theirs),
            }
        )
    return rows


def targets(
    triton: dict[str, Any], diffusers: dict[str, Any], stall_s: float
) -> list[dict[str, Any]]:
    """The issue's targets, each with the figures it was judged on."""
    verdicts = []
    for ours, theirs in _pairs(triton, diffusers):
        if ours.concurrency == 1:
            ratio = ours.seconds_per_image / theirs.seconds_per_image
            verdicts.append(
                {
                    "target": f"{ours.size}/{ours.steps}: time per image alone <= "
                    f"{ALONE_RATIO_TARGET}x diffusers",
                    "value": round(ratio, 3),
                    "met": ratio <= ALONE_RATIO_TARGET,
                }
            )
        else:
            ratio = ours.images_per_s / theirs.images_per_s
            verdicts.append(
                {
                    "target": f"{ours.size}/{ours.steps}: {ours.concurrency} concurrent >= diffusers' batch "
                    f"{theirs.concurrency} images/s",
                    "value": round(ratio, 3),
                    "met": ratio >= 1.0,
                }
            )
    steady = {
        (p.size, p.steps): quantile(p.latencies_s, 0.5)
        for p in triton["points"]
        if p.concurrency == 1
    }
    for first in triton["firsts"]:
        extra = first["seconds"] - steady[(first["size"], first["steps"])]
        verdicts.append(
            {
                "target": f"no stall on a change of size ({first['after']} -> {first['size']}): "
                f"first request within {stall_s} s of the steady one",
                "value": round(extra, 3),
                "met": extra <= stall_s,
            }
        )
    return verdicts


def write_json(
    path: Path,
    config: dict[str, Any],
    triton: dict[str, Any],
    diffusers: dict[str, Any],
    extra: dict[str, Any],
) -> None:
    def points(result: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {**asdict(p), "seconds_per_image": p.seconds_per_image, "images_per_s": p.images_per_s}
            for p in result["points"]
        ]

    def finite(
        value: Any,
    ) -> Any:  # JSON has no infinity: an identical image's PSNR is written as null
        return None if isinstance(value, float) and math.isinf(value) else value

    body = {
        "config": config,
        "triton": {"points": points(triton), "first_after_size_change": triton["firsts"]},
        "diffusers": {"points": points(diffusers), "first_after_size_change": diffusers["firsts"]},
        **extra,
    }
    body["parity"] = [{k: finite(v) for k, v in row.items()} for row in body.get("parity", [])]
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")


def write_plot(path: Path, triton: dict[str, Any], diffusers: dict[str, Any]) -> None:
    sizes = sorted(
        {(p.size, p.steps) for p in triton["points"]}, key=lambda s: int(s[0].split("x")[0])
    )
    with saved_figure(path, 1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False, dpi=110) as (
        figure,
        axes,
    ):
        for axis, (size, steps) in zip(axes[0], sizes, strict=True):
            ours = [p for p in triton["points"] if (p.size, p.steps) == (size, steps)]
            theirs = {
                p.concurrency: p for p in diffusers["points"] if (p.size, p.steps) == (size, steps)
            }
            xs = range(len(ours))
            axis.bar(
                [x - 0.2 for x in xs],
                [p.images_per_s for p in ours],
                0.4,
                label="Triton (c concurrent requests)",
            )
            axis.bar(
                [x + 0.2 for x in xs],
                [
                    theirs[p.concurrency].images_per_s if p.concurrency in theirs else 0
                    for p in ours
                ],
                0.4,
                label="diffusers (batch of c)",
            )
            axis.set_xticks(list(xs), [str(p.concurrency) for p in ours])
            axis.set_xlabel("c")
            axis.set_ylabel("images / s")
            axis.set_title(f"{size}, {steps} steps")
            axis.legend(fontsize=8)
