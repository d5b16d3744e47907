"""Stable Diffusion (diffusers) from a local checkpoint folder: three networks and the pipeline entries.

    checkpoint folder (model_index.json, text_encoder/, tokenizer/, unet/, vae/, scheduler/)
        -> sd_text_encoder, sd_unet (+ sd_unet_fp16), sd_vae_decoder   ONNX entries   (networks.py)
        -> stable_diffusion (+ _fp16)   the denoising loop over them through BLS      (pipelines.py)
        -> stable_diffusion_torch       the loop with the networks in process, FP16 on a GPU
                                        (weights converted and checked: torch_flavour.py)

The folder is named with ``inferctl build stable_diffusion --weights stable_diffusion=PATH`` or
``SD_CHECKPOINT``; without one the build stops with :class:`~builders.errors.MissingInputError`
before anything is written (checkpoint.py). Tests and benchmarks write randomly initialised folders
(``tiny``, or the full ``sd15`` configuration) with :mod:`.random_checkpoint`; builds from them
report ``pretrained: false`` with the preset and seed.
"""

from __future__ import annotations

from builders.families.diffusion.checkpoint import (
    CHECKPOINT_ENV,
    PIPELINE,
    RANDOM_MARKER,
    Checkpoint,
    checkpoint_from,
)
from builders.families.diffusion.networks import (
    SAMPLE_PROMPTS,
    TEXT_ENCODER,
    UNET,
    VAE_DECODER,
    SDTextEncoder,
    SDUNet,
    SDVAEDecoder,
)
from builders.families.diffusion.pipelines import (
    FP16_PIPELINE,
    TORCH_PIPELINE,
    pipeline_spec,
    torch_pipeline_spec,
)
from builders.families.diffusion.random_checkpoint import (
    ensure_random_checkpoint,
    write_random_checkpoint,
    write_tiny_checkpoint,
)

__all__ = [
    "CHECKPOINT_ENV",
    "FP16_PIPELINE",
    "PIPELINE",
    "RANDOM_MARKER",
    "SAMPLE_PROMPTS",
    "TEXT_ENCODER",
    "TORCH_PIPELINE",
    "UNET",
    "VAE_DECODER",
    "Checkpoint",
    "SDTextEncoder",
    "SDUNet",
    "SDVAEDecoder",
    "checkpoint_from",
    "ensure_random_checkpoint",
    "pipeline_spec",
    "torch_pipeline_spec",
    "write_random_checkpoint",
    "write_tiny_checkpoint",
]
