"""``inferctl up``'s image generation: a tiny random-init checkpoint when none is named, written once."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from builders.families.diffusion import CHECKPOINT_ENV, RANDOM_MARKER
from builders.registry import DEFAULT_STACK
from inferctl.up_cmd import _generation_weights
from serving.console import make_console


def _args(tmp_path: Path, models: list[str]) -> argparse.Namespace:
    return argparse.Namespace(models=models, state_dir=tmp_path / "state")


def test_up_serves_generation_from_a_random_checkpoint_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    assert "stable_diffusion" in DEFAULT_STACK
    console = make_console()
    weights = _generation_weights(_args(tmp_path, list(DEFAULT_STACK)), {}, console)
    folder = Path(weights["stable_diffusion"])
    marker = json.loads((folder / RANDOM_MARKER).read_text())
    assert marker["preset"] == "tiny" and marker["seed"] == 0
    unet = sorted((folder / "unet").glob("*.safetensors"))[0]
    written = unet.stat().st_mtime_ns
    # A second `up` reuses the folder (same files, so the build's content hash matches and it is skipped).
    assert _generation_weights(_args(tmp_path, list(DEFAULT_STACK)), {}, console) == weights
    assert unet.stat().st_mtime_ns == written


def test_a_named_checkpoint_or_no_generation_model_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = make_console()
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    named = {"stable_diffusion": "/ckpt/sd15"}
    assert _generation_weights(_args(tmp_path, ["stable_diffusion"]), named, console) == named
    assert _generation_weights(_args(tmp_path, ["image_classifier"]), {}, console) == {}
    monkeypatch.setenv(CHECKPOINT_ENV, "/ckpt/sd15")
    assert _generation_weights(_args(tmp_path, ["stable_diffusion"]), {}, console) == {}
    assert not (tmp_path / "state").exists()
