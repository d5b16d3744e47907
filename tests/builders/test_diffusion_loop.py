"""The pipeline model's loop and request parsing, outside Triton, against diffusers' own pipeline.

The loop (``builders/python_models/diffusion_loop.py``) runs here with the networks in this process
(``TorchNetworks``, FP32 on the CPU) on the tiny checkpoint: rows of every scheduler in one loop,
each compared with diffusers' ``StableDiffusionPipeline`` generating that image alone.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.python_models.diffusion_loop import PipelineParts, Schedulers, generate
from builders.python_models.diffusion_networks import TorchNetworks
from builders.python_models.diffusion_request import (
    GenerationLimits,
    InvalidRequest,
    Request,
    parse_rows,
)
from serving.limits import DEFAULT_LIMITS

SCHEDULERS = dict(DEFAULT_LIMITS.image_generation.schedulers)
#: see tests/builders/test_diffusion.py: rows batched with others may move by a rounding step
PIXEL_TOLERANCE = 2


def _reference(checkpoint: Path, request: Request) -> np.ndarray:
    import diffusers

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(
        str(checkpoint), safety_checker=None, local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    if request.scheduler:
        pipe.scheduler = getattr(diffusers, SCHEDULERS[request.scheduler]).from_config(
            pipe.scheduler.config
        )
    images = pipe(
        request.prompt,
        negative_prompt=request.negative_prompt,
        num_inference_steps=request.steps,
        guidance_scale=request.guidance,
        height=request.height,
        width=request.width,
        generator=torch.Generator("cpu").manual_seed(request.seed),
        output_type="np",
    ).images
    return (images[0] * 255).round().astype(np.uint8)  # type: ignore[no-any-return]


def test_rows_of_every_scheduler_in_one_loop_match_diffusers(sd_checkpoint: Path) -> None:
    from transformers import CLIPTokenizer

    rows: list[tuple[Hashable, Request]] = [
        # Two rows of one lane: an ancestral scheduler draws each row's noise from its own generator.
        (
            "a",
            Request(
                "a red fox",
                steps=3,
                guidance=7.5,
                height=64,
                width=64,
                seed=5,
                scheduler="euler_ancestral",
            ),
        ),
        (
            "b",
            Request(
                "a blue whale",
                steps=3,
                guidance=7.5,
                height=64,
                width=64,
                seed=6,
                scheduler="euler_ancestral",
            ),
        ),
        (
            "c",
            Request(
                "a green frog",
                "blurry",
                steps=4,
                guidance=5.0,
                height=64,
                width=64,
                seed=7,
                scheduler="dpmpp_2m",
            ),
        ),
        (
            "d",
            Request(
                "a lighthouse", steps=2, guidance=1.0, height=64, width=64, seed=8, scheduler="ddim"
            ),
        ),
        (
            "e",
            Request(
                "a bowl of ramen",
                steps=3,
                guidance=7.5,
                height=64,
                width=64,
                seed=9,
                scheduler="euler",
            ),
        ),
        (
            "f",
            Request("an astronaut", steps=2, guidance=7.5, height=64, width=64, seed=10),
        ),  # the checkpoint's PNDM
    ]
    networks = TorchNetworks(str(sd_checkpoint), torch.device("cpu"), torch.float32)
    tokenizer = CLIPTokenizer.from_pretrained(
        str(sd_checkpoint / "tokenizer"), local_files_only=True
    )
    schedulers = Schedulers(str(sd_checkpoint / "scheduler" / "scheduler_config.json"), SCHEDULERS)
    finished: list[list[Hashable]] = []
    images: dict[Hashable, np.ndarray] = {}

    def done(keys: list[Hashable], batch: torch.Tensor) -> None:
        finished.append(keys)
        images.update({key: image.numpy() for key, image in zip(keys, batch, strict=True)})

    timings: dict[str, float] = {}
    parts = PipelineParts(
        networks=networks,
        tokenizer=tokenizer,
        schedulers=schedulers,
        latent_channels=4,
        vae_scale_factor=2,
        scaling_factor=0.18215,
    )
    generate(rows, parts, done, timings)
    # Lanes end as their steps run out (PNDM takes one call more): the shortest first, each answered then.
    assert finished[0] == ["d"] and sorted(k for keys in finished for k in keys) == list("abcdef")
    assert timings["unet_calls"] == 4 and timings["denoise"] > 0
    for key, request in rows:
        expected = _reference(sd_checkpoint, request)
        diff = np.abs(images[key].astype(np.int16) - expected.astype(np.int16)).max()
        assert diff <= PIXEL_TOLERANCE, (
            f"{key} ({request.scheduler or 'default'}): max pixel diff {diff}"
        )


def test_schedulers_refuse_a_class_diffusers_lacks(sd_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="NoSuchScheduler"):
        Schedulers(
            str(sd_checkpoint / "scheduler" / "scheduler_config.json"), {"odd": "NoSuchScheduler"}
        )


LIMITS = GenerationLimits(default_side=64, schedulers=tuple(SCHEDULERS))


def _column(*values: object) -> np.ndarray:
    return np.array([[v] for v in values], dtype=object if isinstance(values[0], bytes) else None)


def test_rows_take_defaults_and_name_the_scheduler() -> None:
    parsed = parse_rows(
        {
            "PROMPT": _column(b"a", b"b"),
            "SCHEDULER": _column(b"default", b"euler"),
            "SEED": _column(1, 2),
        },
        LIMITS,
    )
    assert [r.scheduler for r in parsed] == ["", "euler"]
    assert parsed[0] == Request(
        "a",
        steps=LIMITS.default_steps,
        guidance=LIMITS.default_guidance,
        height=64,
        width=64,
        seed=1,
    )


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({}, "PROMPT is required"),
        (
            {"PROMPT": _column(b"a", b"b"), "STEPS": _column(2)},
            "STEPS must hold exactly one value per row",
        ),
        (
            {"PROMPT": _column(b"a", b"b"), "STEPS": _column(2, 500)},
            r"STEPS must be between 1 and 100, got 500 \(row 1\)",
        ),
        (
            {"PROMPT": _column(b"a"), "SCHEDULER": _column(b"lms")},
            "SCHEDULER must be one of default, pndm",
        ),
        ({"PROMPT": _column(b"\xff")}, "PROMPT is not valid UTF-8"),
        (
            {"PROMPT": _column(b"a", b"b"), "WIDTH": _column(64, 128)},
            "HEIGHT and WIDTH must be the same in every row",
        ),
    ],
)
def test_bad_rows_are_named(arrays: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_rows(arrays, LIMITS)


def test_limits_travel_through_config_parameters() -> None:
    assert GenerationLimits.from_parameters(LIMITS.parameters()) == LIMITS
