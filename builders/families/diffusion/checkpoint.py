"""A local diffusers Stable Diffusion checkpoint folder, checked before anything is built from it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

from builders.errors import MissingInputError
from builders.report import file_sha256
from builders.spec import WeightsInfo

__all__ = [
    "CHECKPOINT_ENV",
    "COMPONENTS",
    "PIPELINE",
    "RANDOM_MARKER",
    "Checkpoint",
    "checkpoint_from",
]

CHECKPOINT_ENV = "SD_CHECKPOINT"
PIPELINE = "stable_diffusion"
#: the networks of a checkpoint, by their diffusers subfolder
COMPONENTS = ("text_encoder", "unet", "vae")
#: written beside a randomly initialised checkpoint (tests, benchmarks): its preset and seed
RANDOM_MARKER = "RANDOM_INIT.json"

_REQUIRED = (
    "model_index.json",
    "text_encoder/config.json",
    "unet/config.json",
    "vae/config.json",
    "scheduler/scheduler_config.json",
    "tokenizer/tokenizer_config.json",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def _weight_files(folder: Path) -> list[Path]:
    return (
        sorted(p for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
        if folder.is_dir()
        else []
    )


class Checkpoint:
    """A local diffusers Stable Diffusion checkpoint folder.

    Raises:
        MissingInputError: the folder is missing, a file, or lacks a component (the message lists what).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise MissingInputError(f"stable_diffusion checkpoint folder not found: {self.path}")
        if not self.path.is_dir():
            raise MissingInputError(
                f"stable_diffusion checkpoint must be a diffusers folder, not a file: {self.path}"
            )
        missing = [name for name in _REQUIRED if not (self.path / name).is_file()]
        missing += [
            f"{sub}/*.safetensors" for sub in COMPONENTS if not _weight_files(self.path / sub)
        ]
        tokenizer = self.path / "tokenizer"
        if not (
            (tokenizer / "tokenizer.json").is_file()
            or ((tokenizer / "vocab.json").is_file() and (tokenizer / "merges.txt").is_file())
        ):
            missing.append("tokenizer/vocab.json+merges.txt (or tokenizer.json)")
        if missing:
            raise MissingInputError(
                f"stable_diffusion checkpoint {self.path} is not a complete diffusers folder; "
                f"missing: {', '.join(missing)}"
            )

    def config(self, component: str) -> dict:
        name = "scheduler_config.json" if component == "scheduler" else "config.json"
        return json.loads((self.path / component / name).read_text(encoding="utf-8"))

    @cached_property
    def random_init(self) -> dict | None:
        """The marker of a randomly initialised checkpoint (preset, seed), or None for real weights."""
        marker = self.path / RANDOM_MARKER
        return json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None

    def weights_info(self, component: str) -> WeightsInfo:
        files = _weight_files(self.path / component)
        first = files[0]
        if self.random_init is not None:
            preset, seed = self.random_init.get("preset", "tiny"), self.random_init.get("seed")
            return WeightsInfo(
                source="random-init",
                pretrained=False,
                path=str(self.path),
                sha256=file_sha256(first),
                note=f"{preset} random-init Stable Diffusion checkpoint (seed {seed}); images mean nothing",
            )
        return WeightsInfo(
            source=f"file:{self.path}",
            pretrained=True,
            path=str(self.path / component / first.name),
            sha256=file_sha256(first),
        )

    def files(self, component: str) -> list[Path]:
        """Files whose content makes ``component`` what it is (config, weights, vocabulary)."""
        folder = self.path / component
        return sorted(
            p
            for p in folder.iterdir()
            if p.is_file() and p.suffix in (".json", ".txt", *_WEIGHT_SUFFIXES)
        )

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.config("vae")["block_out_channels"]) - 1)

    @property
    def size_multiple(self) -> int:
        """HEIGHT/WIDTH must be multiples of this: 8, and whole latents (the VAE's scale factor).

        Latents need not divide by the UNet's own down-sampling factor: diffusers' UNet resizes each
        up-block to its skip connection (``upsample_size``), which is exact for every size; the ONNX
        UNet is traced on a latent size that takes that path (see :mod:`.networks`).
        """
        return max(8, self.vae_scale_factor)

    @property
    def unet_down_factor(self) -> int:
        return 2 ** (len(self.config("unet")["block_out_channels"]) - 1)

    @property
    def native_size(self) -> int:
        """The side the UNet was configured for (``sample_size`` latents), in pixels."""
        return int(self.config("unet").get("sample_size") or 64) * self.vae_scale_factor

    @property
    def max_text_length(self) -> int:
        tokenizer = json.loads(
            (self.path / "tokenizer" / "tokenizer_config.json").read_text(encoding="utf-8")
        )
        length = int(tokenizer.get("model_max_length") or 0)
        if not 0 < length <= 10_000:  # transformers writes a huge sentinel for "no limit"
            length = int(self.config("text_encoder").get("max_position_embeddings", 77))
        return length


def checkpoint_from(weights: Mapping[str, str], name: str) -> Checkpoint:
    """The checkpoint for ``name``: ``--weights name=PATH``, ``--weights stable_diffusion=PATH``, or
    ``SD_CHECKPOINT``.

    Raises:
        MissingInputError: none is given, or the folder is missing or incomplete.
    """
    path = weights.get(name) or weights.get(PIPELINE) or os.environ.get(CHECKPOINT_ENV)
    if not path:
        raise MissingInputError(
            f"{name} needs a local Stable Diffusion checkpoint folder: pass --weights {PIPELINE}=PATH or set "
            f"{CHECKPOINT_ENV}; nothing is downloaded"
        )
    return Checkpoint(path)
