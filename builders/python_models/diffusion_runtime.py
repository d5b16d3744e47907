"""What the Stable Diffusion pipeline model holds between requests, usable outside Triton too.

The pipeline model (``diffusion_pipeline.py``) builds one :class:`PipelineRuntime` from its version
folder and config parameters and runs each cohort of rows through :meth:`PipelineRuntime.generate`.
The GPU benchmark (``loadtest.diffusion_process``) builds the same object from a built entry, so
what it times is the served code, not a copy of it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING or __package__:  # imported from the builders package (tests, benchmarks)
    from builders.python_models.diffusion_loop import (
        Done,
        Networks,
        PipelineParts,
        Schedulers,
        generate,
    )
    from builders.python_models.diffusion_networks import TorchNetworks
    from builders.python_models.diffusion_request import GenerationLimits, Request
else:  # Triton's Python stub: the helper modules lie beside model.py, on sys.path
    from diffusion_loop import Done, Networks, PipelineParts, Schedulers, generate
    from diffusion_networks import TorchNetworks
    from diffusion_request import GenerationLimits, Request

__all__ = ["PipelineRuntime", "torch_networks"]


def torch_networks(
    folder: str, parameters: Mapping[str, str], *, gpu: bool, device_id: int = 0
) -> TorchNetworks:
    """The entry's networks in this process: on GPU ``device_id`` when ``gpu`` (and CUDA is there),
    in the entry's ``precision`` (its weights were published in it)."""
    gpu = gpu and torch.cuda.is_available()
    device = torch.device("cuda", device_id) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
        # cuDNN autotuning would time every new image size on its first request: no stall wanted.
        torch.backends.cudnn.benchmark = False
    dtype = torch.float16 if parameters.get("precision", "fp32") == "fp16" else torch.float32
    return TorchNetworks(folder, device, dtype)


class PipelineRuntime:
    """Tokenizer, schedulers, limits and networks of one pipeline entry.

    Its ``parts`` are what the loop runs a cohort with; its ``limits``, what a request may ask.

    Args:
        folder: the entry's version folder (``tokenizer/``, ``scheduler/`` and, for the torch
            runtime, the weights).
        parameters: the entry's config parameters (``latent_channels``, ``scheduler_classes``,
            ``limit_*``, ...).
        networks: where the text encoder, UNet and VAE run.
    """

    def __init__(self, folder: str, parameters: Mapping[str, str], networks: Networks) -> None:
        from transformers import CLIPTokenizer

        self.limits = GenerationLimits.from_parameters(parameters)
        tokenizer = CLIPTokenizer.from_pretrained(
            os.path.join(folder, "tokenizer"), local_files_only=True
        )
        classes = dict(
            item.split("=", 1)
            for item in parameters.get("scheduler_classes", "").split(",")
            if item
        )
        self.parts = PipelineParts(
            networks=networks,
            tokenizer=tokenizer,
            schedulers=Schedulers(
                os.path.join(folder, "scheduler", "scheduler_config.json"), classes
            ),
            latent_channels=int(parameters["latent_channels"]),
            vae_scale_factor=int(parameters["vae_scale_factor"]),
            scaling_factor=float(parameters["scaling_factor"]),
            guidance_off=getattr(networks, "time_cond_proj_dim", None) is not None,
        )

    def generate(self, rows: Sequence[tuple[Hashable, Request]], done: Done) -> dict[str, float]:
        """Every row (one HEIGHT x WIDTH) in one loop; returns where its time went (see ``generate``)."""
        timings: dict[str, float] = {}
        generate(rows, self.parts, done, timings)
        return timings

    def warm_up(self, steps: int) -> dict[str, float]:
        """One small generation at the default size: CUDA context, kernels and allocator before the
        first request."""
        if steps <= 0:
            return {}
        request = Request(
            prompt="warm-up",
            steps=steps,
            height=self.limits.default_side,
            width=self.limits.default_side,
        )
        return self.generate([(("warm-up", 0), request)], _discard)


def _discard(keys: list[Hashable], images: Any) -> None:
    """A warm-up's images go nowhere."""
