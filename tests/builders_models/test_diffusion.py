"""Stable Diffusion through real Triton (BLS over three ONNX models) against diffusers' own pipeline.

A tiny seeded random checkpoint is written with ``save_pretrained`` and built exactly as a real
checkpoint folder is, into a temporary repository served by its own Triton on free ports.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from builders.errors import MissingInputError
from builders.families.diffusion import CHECKPOINT_ENV, PIPELINE, write_tiny_checkpoint
from builders.pipeline import BuildOptions, build
from serving.launcher import TritonPorts, TritonServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.integration

SD_MODELS = ("sd_text_encoder", "sd_unet", "sd_vae_decoder", PIPELINE)
#: largest per-channel difference (0-255) allowed between the Triton and the diffusers image. Measured
#: 0-1 on this CPU: ONNX Runtime and PyTorch round float32 differently, and a few pixels land on the
#: other side of a .5 when scaled to 0-255.
PIXEL_TOLERANCE = 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("sd-checkpoint") / "tiny-sd", seed=0)


@pytest.fixture(scope="module")
def sd_repository(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("sd-repo") / "model_repository"
    reports = build([PIPELINE], BuildOptions(repository=repository, weights={PIPELINE: str(checkpoint)}))
    assert {r.model for r in reports} == set(SD_MODELS)
    for report in reports:
        if report.model != PIPELINE:
            assert report.weights["pretrained"] is False and "tiny random" in report.weights["note"]
    return repository


@pytest.fixture(scope="module")
def sd_server(sd_repository: Path) -> Iterator[TritonServer]:
    with TritonServer(sd_repository, models=list(SD_MODELS), ports=TritonPorts.free()) as server:
        yield server


@pytest.fixture(scope="module")
def client(sd_server: TritonServer) -> http.InferenceServerClient:
    return http.InferenceServerClient(sd_server.http_url, network_timeout=120.0, connection_timeout=120.0)


@pytest.fixture(scope="module")
def diffusers_pipe(checkpoint: Path):  # type: ignore[no-untyped-def]
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(checkpoint), safety_checker=None, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _inputs(**fields: object) -> list[http.InferInput]:
    types = {"PROMPT": ("BYTES", object), "NEGATIVE_PROMPT": ("BYTES", object), "STEPS": ("INT32", np.int32),
             "GUIDANCE": ("FP32", np.float32), "HEIGHT": ("INT32", np.int32), "WIDTH": ("INT32", np.int32),
             "SEED": ("INT64", np.int64)}
    tensors = []
    for name, value in fields.items():
        triton_type, dtype = types[name]
        tensor = http.InferInput(name, [1], triton_type)
        data = np.array([value.encode() if isinstance(value, str) else value], dtype=dtype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def _generate(client: http.InferenceServerClient, **fields: object) -> np.ndarray:
    return client.infer(PIPELINE, _inputs(**fields)).as_numpy("IMAGE")


def _reference(pipe, prompt: str, negative: str | None, steps: int, guidance: float, height: int, width: int,  # type: ignore[no-untyped-def]
               seed: int) -> np.ndarray:
    import torch

    images = pipe(prompt, negative_prompt=negative, num_inference_steps=steps, guidance_scale=guidance,
                  height=height, width=width, generator=torch.Generator("cpu").manual_seed(seed), output_type="np").images
    return (images[0] * 255).round().astype(np.uint8)


@pytest.mark.parametrize(("height", "width", "guidance", "steps"), [(64, 64, 7.5, 3), (48, 80, 4.0, 2), (64, 64, 1.0, 4)])
def test_triton_image_matches_diffusers(client, diffusers_pipe, height: int, width: int, guidance: float, steps: int) -> None:
    prompt, negative, seed = "a photograph of an astronaut riding a horse", "blurry, low quality", 42
    image = _generate(client, PROMPT=prompt, NEGATIVE_PROMPT=negative, STEPS=steps, GUIDANCE=guidance,
                      HEIGHT=height, WIDTH=width, SEED=seed)
    expected = _reference(diffusers_pipe, prompt, negative, steps, guidance, height, width, seed)
    assert image.shape == (height, width, 3) and image.dtype == np.uint8
    diff = np.abs(image.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() <= PIXEL_TOLERANCE, f"max pixel diff {diff.max()}, {np.mean(diff > 0):.4f} of values differ"
    assert expected.std() > 1.0, "the reference is not a flat image (the comparison means something)"


def test_optional_inputs_take_defaults_like_diffusers(client, diffusers_pipe) -> None:
    # Only PROMPT, STEPS and SEED: no negative prompt (""), guidance 7.5, the checkpoint's native 64x64.
    image = _generate(client, PROMPT="a lighthouse", STEPS=2, SEED=7)
    expected = _reference(diffusers_pipe, "a lighthouse", None, 2, 7.5, 64, 64, 7)
    assert image.shape == (64, 64, 3)
    assert np.abs(image.astype(np.int16) - expected).max() <= PIXEL_TOLERANCE


def test_seed_decides_the_image(client) -> None:
    first = _generate(client, PROMPT="a red fox", STEPS=2, SEED=1)
    again = _generate(client, PROMPT="a red fox", STEPS=2, SEED=1)
    other = _generate(client, PROMPT="a red fox", STEPS=2, SEED=2)
    np.testing.assert_array_equal(first, again)
    assert np.abs(first.astype(np.int16) - other).max() > 10


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"HEIGHT": 60}, "HEIGHT"),
        ({"WIDTH": 4096}, "WIDTH"),
        ({"STEPS": 0}, "STEPS"),
        ({"STEPS": 101}, "STEPS"),
        ({"GUIDANCE": -1.0}, "GUIDANCE"),
        ({"GUIDANCE": float("nan")}, "GUIDANCE"),
        ({"SEED": -5}, "SEED"),
    ],
)
def test_bad_request_is_invalid_argument_naming_the_field(client, fields: dict[str, object], named: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _generate(client, **{"PROMPT": "a cat", "STEPS": 2, **fields})
    assert named in caught.value.message()
    assert caught.value.status() == "400", caught.value  # INVALID_ARG, the client's fault
    # The model stays up for the next request.
    assert client.is_model_ready(PIPELINE)


def test_missing_prompt_is_rejected(client) -> None:
    with pytest.raises(InferenceServerException, match="PROMPT"):
        client.infer(PIPELINE, _inputs(STEPS=2))


def _snapshot(repository: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(repository)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(repository.rglob("*")) if p.is_file()}


def test_missing_checkpoint_stops_the_build_and_leaves_the_repository(sd_repository: Path, tmp_path: Path) -> None:
    before = _snapshot(sd_repository)
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(MissingInputError, match="checkpoint folder not found") as caught:
        build([PIPELINE], BuildOptions(repository=sd_repository, weights={PIPELINE: str(missing)}, force=True))
    assert str(missing) in str(caught.value)
    assert _snapshot(sd_repository) == before


def test_incomplete_checkpoint_names_what_is_missing(sd_repository: Path, checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken-sd"
    shutil.copytree(checkpoint, broken)
    shutil.rmtree(broken / "unet")
    before = _snapshot(sd_repository)
    with pytest.raises(MissingInputError, match=r"unet/config\.json"):
        build([PIPELINE], BuildOptions(repository=sd_repository, weights={PIPELINE: str(broken)}, force=True))
    assert _snapshot(sd_repository) == before


def test_no_checkpoint_at_all_says_how_to_give_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    repository = tmp_path / "repo"
    with pytest.raises(MissingInputError, match=CHECKPOINT_ENV):
        build(["sd_unet"], BuildOptions(repository=repository))
    assert not repository.exists()


@pytest.mark.parametrize("scheduler", ["PNDMScheduler", "DDIMScheduler"])
@pytest.mark.parametrize("steps", [1, 2, 5, 13])
def test_ported_scheduler_steps_as_diffusers_does(diffusers_pipe, scheduler: str, steps: int) -> None:
    import diffusers
    import torch

    from builders.python_models.diffusion_pipeline import _Scheduler

    theirs = getattr(diffusers, scheduler).from_config(diffusers_pipe.scheduler.config)
    ours = _Scheduler({**theirs.config, "_class_name": scheduler})
    theirs.set_timesteps(steps)
    ours.set_timesteps(steps)
    torch.testing.assert_close(ours.timesteps, theirs.timesteps, rtol=0, atol=0)
    generator = torch.Generator().manual_seed(3)
    latents_a = latents_b = torch.randn((1, 4, 8, 8), generator=generator)
    for t in theirs.timesteps:
        noise = torch.randn((1, 4, 8, 8), generator=generator)
        latents_a = theirs.step(noise, t, latents_a, return_dict=False)[0]
        latents_b = ours.step(noise, t, latents_b)
    torch.testing.assert_close(latents_b, latents_a, rtol=0, atol=0)


def test_clip_tokenizer_matches_transformers(checkpoint: Path) -> None:
    from transformers import CLIPTokenizer

    from builders.python_models.diffusion_pipeline import ClipTokenizer

    texts = ["a photograph of an astronaut", "", "Ünïcödé 東京 🙂 <|endoftext|> x", "the " * 100,
             "  Multiple   SPACES\n\tand newlines  "]
    ours = ClipTokenizer(str(checkpoint / "tokenizer"))(texts).input_ids
    theirs = CLIPTokenizer.from_pretrained(str(checkpoint / "tokenizer"), local_files_only=True)(
        texts, padding="max_length", max_length=77, truncation=True, return_tensors="np").input_ids
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape == (len(texts), 77)


def test_unsupported_scheduler_is_refused_at_build_time(checkpoint: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from builders.errors import BuildError

    other = tmp_path / "euler-sd"
    shutil.copytree(checkpoint, other)
    config_path = other / "scheduler" / "scheduler_config.json"
    config = json.loads(config_path.read_text())
    config["_class_name"] = "EulerAncestralDiscreteScheduler"
    config_path.write_text(json.dumps(config))
    with pytest.raises(BuildError, match="EulerAncestralDiscreteScheduler"):
        build([PIPELINE], BuildOptions(repository=tmp_path / "repo", weights={PIPELINE: str(other)}))
    assert not (tmp_path / "repo").exists()
