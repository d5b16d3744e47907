"""Stable Diffusion through real Triton against diffusers' own pipeline, on the tiny checkpoint.

Both pipeline entries are served by one Triton (the shared ``sd_triton`` fixture): ``stable_diffusion``
(the loop calling the three ONNX networks through BLS) and ``stable_diffusion_torch`` (the networks
in the pipeline model's own process, FP32 on this CPU). The reference is diffusers'
``StableDiffusionPipeline`` from the same folder, with the scheduler a request names built as users
build it (``Class.from_config(pipe.scheduler.config)``) and the same CPU generator seed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from builders.errors import BuildError, MissingInputError
from builders.families.diffusion import CHECKPOINT_ENV, PIPELINE, TORCH_PIPELINE
from builders.pipeline import BuildOptions, build
from builders.report import BuildReport
from serving.launcher import TritonServer
from serving.limits import DEFAULT_LIMITS

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.integration

#: largest per-channel difference (0-255) allowed between the Triton and the diffusers image. Measured
#: 0-1 for the ONNX path on this CPU (ONNX Runtime and PyTorch round float32 differently, and a few
#: pixels land on the other side of a .5 when scaled to 0-255); the torch path measured 0.
PIXEL_TOLERANCE = 2
SCHEDULERS = DEFAULT_LIMITS.image_generation.schedulers
TYPES = {
    "PROMPT": ("BYTES", object),
    "NEGATIVE_PROMPT": ("BYTES", object),
    "STEPS": ("INT32", np.int32),
    "GUIDANCE": ("FP32", np.float32),
    "HEIGHT": ("INT32", np.int32),
    "WIDTH": ("INT32", np.int32),
    "SEED": ("INT64", np.int64),
    "SCHEDULER": ("BYTES", object),
}


@pytest.fixture(scope="module")
def client(sd_triton: TritonServer) -> Iterator[http.InferenceServerClient]:
    client = http.InferenceServerClient(
        sd_triton.http_url, network_timeout=300.0, connection_timeout=300.0
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def diffusers_pipe(sd_checkpoint: Path):  # type: ignore[no-untyped-def]
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        str(sd_checkpoint), safety_checker=None, local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _inputs(rows: list[dict[str, object]]) -> list[http.InferInput]:
    """One Triton request of ``len(rows)`` rows ([n, 1] per input); every row names the same inputs."""
    tensors = []
    for name in rows[0]:
        triton_type, dtype = TYPES[name]
        values = [
            [r[name].encode() if isinstance(r[name], str) else r[name]]  # type: ignore[union-attr]
            for r in rows
        ]
        tensor = http.InferInput(name, [len(rows), 1], triton_type)
        tensor.set_data_from_numpy(np.array(values, dtype=dtype))
        tensors.append(tensor)
    return tensors


def _generate(
    client: http.InferenceServerClient, model: str = PIPELINE, **fields: object
) -> np.ndarray:
    image = client.infer(model, _inputs([fields])).as_numpy("IMAGE")
    assert image.shape[0] == 1
    return image[0]


def _reference(
    pipe,
    *,
    prompt: str,
    negative: str | None = None,
    steps: int,
    guidance: float = 7.5,  # type: ignore[no-untyped-def]
    height: int = 64,
    width: int = 64,
    seed: int,
    scheduler: str = "default",
) -> np.ndarray:
    import diffusers
    import torch

    own = pipe.scheduler
    if scheduler != "default":
        pipe.scheduler = getattr(diffusers, SCHEDULERS[scheduler]).from_config(own.config)
    try:
        images = pipe(
            prompt,
            negative_prompt=negative,
            num_inference_steps=steps,
            guidance_scale=guidance,
            height=height,
            width=width,
            generator=torch.Generator("cpu").manual_seed(seed),
            output_type="np",
        ).images
    finally:
        pipe.scheduler = own
    return (images[0] * 255).round().astype(np.uint8)  # type: ignore[no-any-return]


def _close(image: np.ndarray, expected: np.ndarray) -> None:
    assert image.shape == expected.shape and image.dtype == np.uint8
    diff = np.abs(image.astype(np.int16) - expected.astype(np.int16))
    assert diff.max() <= PIXEL_TOLERANCE, (
        f"max pixel diff {diff.max()}, {np.mean(diff > 0):.4f} of values differ"
    )
    assert expected.std() > 1.0, (
        "the reference is not a flat image (the comparison means something)"
    )


@pytest.mark.parametrize(
    ("model", "height", "width", "guidance", "steps", "scheduler"),
    [
        (PIPELINE, 64, 64, 7.5, 3, "default"),
        (PIPELINE, 64, 80, 4.0, 2, "euler_ancestral"),
        (PIPELINE, 64, 64, 1.0, 3, "dpmpp_2m"),
        (TORCH_PIPELINE, 64, 64, 7.5, 3, "euler"),
        (TORCH_PIPELINE, 80, 64, 7.5, 2, "ddim"),
        (TORCH_PIPELINE, 64, 64, 5.0, 3, "pndm"),
    ],
)
def test_triton_image_matches_diffusers(
    client,
    diffusers_pipe,
    model: str,
    height: int,
    width: int,
    guidance: float,
    steps: int,
    scheduler: str,
) -> None:
    fields = {
        "prompt": "a photograph of an astronaut riding a horse",
        "negative": "blurry, low quality",
        "seed": 42,
    }
    image = _generate(
        client,
        model,
        PROMPT=fields["prompt"],
        NEGATIVE_PROMPT=fields["negative"],
        STEPS=steps,
        GUIDANCE=guidance,
        HEIGHT=height,
        WIDTH=width,
        SEED=fields["seed"],
        SCHEDULER=scheduler,
    )
    _close(
        image,
        _reference(
            diffusers_pipe,
            prompt=str(fields["prompt"]),
            negative=str(fields["negative"]),
            steps=steps,
            guidance=guidance,
            height=height,
            width=width,
            seed=42,
            scheduler=scheduler,
        ),
    )


def test_optional_inputs_take_defaults_like_diffusers(client, diffusers_pipe) -> None:
    # Only PROMPT, STEPS and SEED: no negative prompt (""), guidance 7.5, the checkpoint's native
    # 64x64, its PNDM.
    image = _generate(client, PROMPT="a lighthouse", STEPS=2, SEED=7)
    _close(image, _reference(diffusers_pipe, prompt="a lighthouse", steps=2, seed=7))


def test_rows_of_one_request_share_one_loop(
    client, diffusers_pipe, sd_triton: TritonServer
) -> None:
    # Three images in one request: other schedulers, step counts and guidance run side by side in the
    # same UNet calls, and each is the image it would be alone.
    rows: list[dict[str, object]] = [
        {"PROMPT": "a red fox", "STEPS": 3, "GUIDANCE": 7.5, "SEED": 1, "SCHEDULER": "euler"},
        {"PROMPT": "a blue whale", "STEPS": 2, "GUIDANCE": 4.0, "SEED": 2, "SCHEDULER": "dpmpp_2m"},
        {"PROMPT": "a green frog", "STEPS": 3, "GUIDANCE": 1.0, "SEED": 3, "SCHEDULER": "default"},
    ]
    seen = len(list(sd_triton.iter_log()))
    images = client.infer(TORCH_PIPELINE, _inputs(rows)).as_numpy("IMAGE")
    assert images.shape == (3, 64, 64, 3)
    for image, row in zip(images, rows, strict=True):
        _close(
            image,
            _reference(
                diffusers_pipe,
                prompt=str(row["PROMPT"]),
                steps=int(row["STEPS"]),  # type: ignore[call-overload]
                guidance=float(row["GUIDANCE"]),
                seed=int(row["SEED"]),  # type: ignore[arg-type]
                scheduler=str(row["SCHEDULER"]),
            ),
        )
    loops = [
        line
        for line in list(sd_triton.iter_log())[seen:]
        if f"{TORCH_PIPELINE}: loop rows=" in line
    ]
    # PNDM takes one UNet call more than its steps: 4 calls for the longest lane, all rows in each.
    assert loops and "rows=3 " in loops[-1] and "unet_calls=4 " in loops[-1], loops


def test_concurrent_requests_are_batched_into_one_loop(client, sd_triton: TritonServer) -> None:
    # A long generation holds the only instance; requests sent meanwhile queue, and Triton's dynamic
    # batcher hands them to one execute(), which runs them in one loop.
    before = _statistics(sd_triton)
    seen = len(list(sd_triton.iter_log()))
    rows = {
        "PROMPT": "a cat",
        "STEPS": 2,
        "GUIDANCE": 7.5,
        "HEIGHT": 64,
        "WIDTH": 64,
        "SCHEDULER": "euler",
    }
    results: dict[int, np.ndarray] = {}

    go = threading.Event()

    def send(seed: int, steps: int) -> None:
        # A client of its own (the HTTP client is bound to its thread), connected before the go:
        # a follower's request reaches Triton's queue within milliseconds of it.
        own = http.InferenceServerClient(
            sd_triton.http_url, network_timeout=300.0, connection_timeout=300.0
        )
        try:
            assert own.is_server_live()
            inputs = _inputs([{**rows, "STEPS": steps, "SEED": seed}])
            if seed:
                go.wait(timeout=300)
            results[seed] = own.infer(TORCH_PIPELINE, inputs).as_numpy("IMAGE")[0]
        finally:
            own.close()

    followers = [threading.Thread(target=send, args=(seed, 2)) for seed in (1, 2, 3)]
    for thread in followers:
        thread.start()
    # The blocker must outlast three requests' arrival in the queue and end before they have waited
    # past the queue policy's timeout (serving.limits: 30 s): with 20 steps they timed out on two
    # cores busy with other test runs; 10 steps take half as long.
    blocker = threading.Thread(target=send, args=(0, 10))
    blocker.start()
    try:
        _wait_for_log(
            sd_triton, seen, f"{TORCH_PIPELINE}: execute requests=1"
        )  # the blocker is running
    finally:
        go.set()
    deadline = time.monotonic() + 60
    while _pending(sd_triton) < 3:  # all three queued while the blocker still runs
        assert blocker.is_alive(), "the blocking generation ended before the others were queued"
        assert time.monotonic() < deadline, "the three requests never queued"
        time.sleep(0.01)
    for thread in (blocker, *followers):
        thread.join(timeout=600)
    assert set(results) == {0, 1, 2, 3}
    # The model answers each request as soon as its image is decoded, before execute() returns:
    # Triton counts the execution (and the model logs its loop) a moment after the client has its image.
    deadline = time.monotonic() + 60
    while True:
        loops = [
            line
            for line in list(sd_triton.iter_log())[seen:]
            if f"{TORCH_PIPELINE}: loop rows=" in line
        ]
        after = _statistics(sd_triton)
        requests = int(after["inference_count"]) - int(before["inference_count"])
        executions = int(after["execution_count"]) - int(before["execution_count"])
        if (requests >= 4 and len(loops) >= 2) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert requests == 4 and executions == 2, (requests, executions, loops)
    assert any("rows=3 " in line for line in loops), loops
    # Batched or alone, a seed makes the same image.
    alone = _generate(client, TORCH_PIPELINE, **{**rows, "SEED": 2})
    assert np.abs(alone.astype(np.int16) - results[2]).max() <= PIXEL_TOLERANCE


def _statistics(server: TritonServer) -> dict[str, Any]:
    """Triton's inference statistics of the torch pipeline."""
    with http.InferenceServerClient(server.http_url) as client:
        statistics = client.get_inference_statistics(TORCH_PIPELINE)
        return statistics["model_stats"][0]  # type: ignore[no-any-return]


def _pending(server: TritonServer) -> int:
    """Requests Triton holds queued for the torch pipeline (its metrics)."""
    import httpx

    for line in httpx.get(server.metrics_url).text.splitlines():
        if (
            line.startswith("nv_inference_pending_request_count")
            and f'model="{TORCH_PIPELINE}"' in line
        ):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _wait_for_log(server: TritonServer, seen: int, text: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in list(server.iter_log())[seen:]):
        assert time.monotonic() < deadline, f"Triton never logged {text!r}"
        time.sleep(0.01)


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
        ({"HEIGHT": 48}, "HEIGHT"),  # a multiple of 8, but below the platform's smallest side
        ({"WIDTH": 4096}, "WIDTH"),
        ({"STEPS": 0}, "STEPS"),
        ({"STEPS": 101}, "STEPS"),
        ({"GUIDANCE": -1.0}, "GUIDANCE"),
        ({"GUIDANCE": float("nan")}, "GUIDANCE"),
        ({"SEED": -5}, "SEED"),
        ({"SCHEDULER": "lms"}, "SCHEDULER"),
        ({"PROMPT": "a cat " * 1000}, "PROMPT"),  # over the platform's prompt bytes
    ],
)
def test_bad_request_is_invalid_argument_naming_the_field(
    client, fields: dict[str, object], named: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _generate(client, **{"PROMPT": "a cat", "STEPS": 2, **fields})
    assert named in caught.value.message()
    assert caught.value.status() == "400", caught.value  # INVALID_ARG, the client's fault
    assert client.is_model_ready(PIPELINE)  # the model stays up for the next request


def test_rows_of_different_sizes_are_refused(client) -> None:
    rows: list[dict[str, object]] = [
        {"PROMPT": "a", "STEPS": 1, "HEIGHT": 64},
        {"PROMPT": "b", "STEPS": 1, "HEIGHT": 72},
    ]
    with pytest.raises(InferenceServerException, match="HEIGHT and WIDTH") as caught:
        client.infer(TORCH_PIPELINE, _inputs(rows))
    assert caught.value.status() == "400"


def test_missing_prompt_is_rejected(client) -> None:
    with pytest.raises(InferenceServerException, match="PROMPT"):
        client.infer(PIPELINE, _inputs([{"STEPS": 2}]))


def test_build_reports_hash_every_published_file(sd_repository: Path) -> None:
    torch_entry = sd_repository / TORCH_PIPELINE / "1"
    report = BuildReport.read(torch_entry / "build_report.json")
    # (Triton's Python stub caches the helper modules' bytecode in __pycache__ beside them.)
    published = sorted(
        str(p.relative_to(torch_entry))
        for p in torch_entry.rglob("*")
        if p.is_file() and p.name != "build_report.json" and "__pycache__" not in p.parts
    )
    assert report.artifact_files() == published
    assert {
        "unet/diffusion_pytorch_model.safetensors",
        "vae/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/vocab.json",
        "scheduler/scheduler_config.json",
    } <= set(published)
    assert report.precision == "fp32" and set(report.parity) == {"text_encoder", "unet", "vae"}
    assert all(
        p["max_abs_error"] == 0.0 for p in report.parity.values()
    )  # FP32 on the CPU: the same module
    fp16 = BuildReport.read(sd_repository / "sd_unet_fp16" / "1" / "build_report.json")
    assert fp16.precision == "fp16" and fp16.parity["noise_pred"]["min_cosine"] >= 0.9995


def _snapshot(repository: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(repository)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(repository.rglob("*"))
        if p.is_file()
    }


def test_missing_checkpoint_stops_the_build_and_leaves_the_repository(
    sd_repository: Path, tmp_path: Path
) -> None:
    before = _snapshot(sd_repository)
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(MissingInputError, match="checkpoint folder not found") as caught:
        build(
            [PIPELINE],
            BuildOptions(repository=sd_repository, weights={PIPELINE: str(missing)}, force=True),
        )
    assert str(missing) in str(caught.value)
    assert _snapshot(sd_repository) == before


def test_incomplete_checkpoint_names_what_is_missing(
    sd_repository: Path, sd_checkpoint: Path, tmp_path: Path
) -> None:
    import shutil

    broken = tmp_path / "broken-sd"
    shutil.copytree(sd_checkpoint, broken)
    shutil.rmtree(broken / "unet")
    before = _snapshot(sd_repository)
    with pytest.raises(MissingInputError, match=r"unet/config\.json"):
        build(
            [PIPELINE],
            BuildOptions(repository=sd_repository, weights={PIPELINE: str(broken)}, force=True),
        )
    assert _snapshot(sd_repository) == before


def test_no_checkpoint_at_all_says_how_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    repository = tmp_path / "repo"
    with pytest.raises(MissingInputError, match=CHECKPOINT_ENV):
        build(["sd_unet"], BuildOptions(repository=repository))
    assert not repository.exists()


def test_a_scheduler_diffusers_lacks_is_refused_at_build_time(
    sd_checkpoint: Path, tmp_path: Path
) -> None:
    import json
    import shutil

    other = tmp_path / "odd-scheduler-sd"
    shutil.copytree(sd_checkpoint, other)
    config_path = other / "scheduler" / "scheduler_config.json"
    config = json.loads(config_path.read_text())
    config["_class_name"] = "NoSuchScheduler"
    config_path.write_text(json.dumps(config))
    with pytest.raises(BuildError, match="NoSuchScheduler"):
        build(
            [PIPELINE], BuildOptions(repository=tmp_path / "repo", weights={PIPELINE: str(other)})
        )
    assert not (tmp_path / "repo" / PIPELINE).exists()
