"""Randomly initialised Stable Diffusion checkpoint folders, written as diffusers writes real ones.

    python -m builders.families.diffusion.random_checkpoint /tmp/sd15-random --preset sd15 --device cuda

Two presets, both saved with ``save_pretrained`` so the builders read them exactly as a real
checkpoint folder:

- ``tiny`` (tests, CI): UNet with block_out_channels (32, 64), a 2-layer CLIP text model of width
  32, a 2-level VAE; a few MB.
- ``sd15``: the Stable Diffusion 1.5 configuration (values of the published ``unet``, ``vae``,
  ``text_encoder`` and ``scheduler`` configs, written out below): an 860M-parameter UNet, the
  123M-parameter CLIP ViT-L/14 text model with its 49,408-entry embedding table, the 84M-parameter
  VAE, a PNDM scheduler. Same shapes and compute as the real model, random weights: 3.4 GB in FP32.

No CLIP vocabulary can be downloaded here, so both use a tiny byte-level BPE vocabulary (every byte,
alone and word-final, plus a few merges) in CLIP's file layout (``vocab.json`` + ``merges.txt``).
Token ids only index the text encoder's embedding table, so speed and parity are those of the real
tokenizer's ids; the prompts merely split into more tokens.

Weights are seeded (``torch.manual_seed``) and drawn on ``device`` (``cuda`` makes the 1B
parameters of ``sd15`` in seconds; the same seed gives the same weights on the same kind of device).
A ``RANDOM_INIT.json`` marker records the preset and seed; builds from such a folder report
``pretrained: false``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from builders.families.diffusion.checkpoint import RANDOM_MARKER

__all__ = [
    "PRESETS",
    "ensure_random_checkpoint",
    "write_random_checkpoint",
    "write_tiny_checkpoint",
]

_SD_SCHEDULER: dict[str, Any] = {
    "_class_name": "PNDMScheduler",
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "skip_prk_steps": True,
    "set_alpha_to_one": False,
    "steps_offset": 1,
    "clip_sample": False,
    "trained_betas": None,
}

#: unet, vae and text_encoder configs of each preset (``vocab_size`` None: the tokenizer's size)
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "unet": {
            "block_out_channels": [32, 64],
            "layers_per_block": 1,
            "sample_size": 32,
            "in_channels": 4,
            "out_channels": 4,
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
            "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
            "cross_attention_dim": 32,
            "attention_head_dim": 8,
            "norm_num_groups": 32,
        },
        "vae": {
            "block_out_channels": [32, 64],
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            "layers_per_block": 1,
            "down_block_types": ["DownEncoderBlock2D"] * 2,
            "up_block_types": ["UpDecoderBlock2D"] * 2,
            "norm_num_groups": 32,
            "sample_size": 64,
        },
        "text_encoder": {
            "vocab_size": None,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 77,
            "layer_norm_eps": 1e-5,
        },
    },
    "sd15": {
        "unet": {
            "act_fn": "silu",
            "attention_head_dim": 8,
            "block_out_channels": [320, 640, 1280, 1280],
            "center_input_sample": False,
            "cross_attention_dim": 768,
            "down_block_types": [
                "CrossAttnDownBlock2D",
                "CrossAttnDownBlock2D",
                "CrossAttnDownBlock2D",
                "DownBlock2D",
            ],
            "downsample_padding": 1,
            "flip_sin_to_cos": True,
            "freq_shift": 0,
            "in_channels": 4,
            "layers_per_block": 2,
            "mid_block_scale_factor": 1,
            "norm_eps": 1e-5,
            "norm_num_groups": 32,
            "out_channels": 4,
            "sample_size": 64,
            "up_block_types": [
                "UpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
            ],
        },
        "vae": {
            "act_fn": "silu",
            "block_out_channels": [128, 256, 512, 512],
            "down_block_types": ["DownEncoderBlock2D"] * 4,
            "in_channels": 3,
            "latent_channels": 4,
            "layers_per_block": 2,
            "norm_num_groups": 32,
            "out_channels": 3,
            "sample_size": 512,
            "up_block_types": ["UpDecoderBlock2D"] * 4,
        },
        "text_encoder": {
            "vocab_size": 49408,
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "max_position_embeddings": 77,
            "hidden_act": "quick_gelu",
            "layer_norm_eps": 1e-5,
            "projection_dim": 768,
            "attention_dropout": 0.0,
            "dropout": 0.0,
            "initializer_factor": 1.0,
            "initializer_range": 0.02,
        },
    },
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's byte -> printable character table (the byte-level BPE alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def _tiny_vocabulary() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A real CLIP BPE vocabulary, tiny: every byte, alone and word-final, plus a few merges."""
    alphabet = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for symbol in alphabet:
        vocab.setdefault(symbol, len(vocab))
    for symbol in alphabet:
        vocab.setdefault(symbol + "</w>", len(vocab))
    merges = []
    for pair in (
        "t h",
        "th e</w>",
        "a n",
        "i n",
        "o n</w>",
        "e r",
        "a t",
        "e d</w>",
        "o f</w>",
        "in g</w>",
    ):
        left, right = pair.split(" ")
        merges.append((left, right))
        vocab.setdefault(left + right, len(vocab))
    return vocab, merges


def write_random_checkpoint(
    path: str | os.PathLike[str], preset: str = "tiny", seed: int = 0, device: str = "cpu"
) -> Path:
    """Save a seeded, randomly initialised ``StableDiffusionPipeline`` of ``preset`` to ``path``.

    Raises:
        ValueError: an unknown preset.
    """
    import torch
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    configs = PRESETS[preset]
    target = Path(path)
    vocab, merges = _tiny_vocabulary()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)  # type: ignore[arg-type]
    text = dict(configs["text_encoder"])
    text["vocab_size"] = text["vocab_size"] or len(tokenizer)
    torch.manual_seed(seed)
    with torch.device(device):
        unet = UNet2DConditionModel.from_config(configs["unet"])
        vae = AutoencoderKL.from_config(configs["vae"])
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                **text,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
    scheduler = PNDMScheduler.from_config(_SD_SCHEDULER)
    pipe = StableDiffusionPipeline(
        vae=vae.to("cpu"),
        text_encoder=text_encoder.to("cpu"),  # type: ignore[arg-type]
        tokenizer=tokenizer,
        unet=unet.to("cpu"),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(str(target), safe_serialization=True)  # type: ignore[attr-defined]
    # Lay the tokenizer out as real SD 1.x checkpoints do (vocab.json + merges.txt, no tokenizer.json),
    # so builds and tests read the files production reads.
    tokenizer_dir = target / "tokenizer"
    (tokenizer_dir / "vocab.json").write_text(
        json.dumps(vocab, ensure_ascii=False), encoding="utf-8"
    )
    (tokenizer_dir / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8"
    )
    (tokenizer_dir / "tokenizer.json").unlink(missing_ok=True)
    marker = {
        "preset": preset,
        "seed": seed,
        "device": torch.device(device).type,
        "note": "random weights: same shapes and compute as the preset's model, images mean nothing",
    }
    (target / RANDOM_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    return target


def write_tiny_checkpoint(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """The ``tiny`` preset on the CPU: what tests build and generate with."""
    return write_random_checkpoint(path, "tiny", seed)


def ensure_random_checkpoint(
    path: str | os.PathLike[str], preset: str = "tiny", seed: int = 0
) -> Path:
    """The random checkpoint of ``preset`` and ``seed`` at ``path``: written once, reused after.

    What ``inferctl up`` serves when no checkpoint folder is named. Reusing the folder (its files,
    hence the builds' content hashes, stay the same) lets a later ``up`` skip the build; a folder
    whose marker names another preset or seed, or that is incomplete, is written again.
    """
    from builders.errors import MissingInputError
    from builders.families.diffusion.checkpoint import Checkpoint

    target = Path(path)
    try:
        marker = Checkpoint(target).random_init
    except MissingInputError:
        marker = None
    if marker is not None and marker.get("preset") == preset and marker.get("seed") == seed:
        return target
    return write_random_checkpoint(target, preset, seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.families.diffusion.random_checkpoint",
        description="Write a seeded, randomly initialised Stable Diffusion checkpoint folder.",
    )
    parser.add_argument("path", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="sd15")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        default="cpu",
        help="where weights are drawn: cpu or cuda (much faster for sd15)",
    )
    args = parser.parse_args(argv)
    print(write_random_checkpoint(args.path, args.preset, args.seed, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
