"""The torch flavour of a checkpoint's networks: weights the pipeline model runs in its own process.

GPU hosts here have no TensorRT and only the CPU onnxruntime, so ``stable_diffusion_torch`` runs
the text encoder, UNet and VAE with torch, FP16 on CUDA, inside the pipeline model: no trip through
Triton per denoising step. This module makes its weights at build time: each network is loaded with
the class the checkpoint names (transformers' ``CLIPTextModel``, diffusers' ``UNet2DConditionModel``
and ``AutoencoderKL``), converted to the entry's precision, checked against the FP32 module on the
same real inputs as the ONNX entries (:mod:`.networks`), and saved with ``save_pretrained`` into
``text_encoder/``, ``unet/`` and ``vae/`` of the version folder (configs + safetensors, hashed in the
build report). A check outside its tolerance stops the build before anything is published.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from builders.errors import ParityError
from builders.families.diffusion.checkpoint import COMPONENTS, Checkpoint
from builders.families.diffusion.networks import (
    SDTextEncoder,
    SDUNet,
    SDVAEDecoder,
    load_text_encoder,
)
from builders.parity import compare
from builders.spec import ProducedFiles, Tolerance

__all__ = ["PRECISIONS", "TOLERANCES", "produce_weights"]

PRECISIONS = ("fp32", "fp16")
#: FP16 vs the FP32 module, gated on cosine: random-init checkpoints have no meaningful output
#: scale, so absolute errors are recorded but not gated (FP32 must match exactly)
TOLERANCES = {
    "fp16": Tolerance(max_abs_error=float("inf"), min_cosine=0.999),
    "fp32": Tolerance(max_abs_error=0.0, min_cosine=0.999999),
}
_SPECS: dict[str, type[SDTextEncoder | SDUNet | SDVAEDecoder]] = {
    "text_encoder": SDTextEncoder,
    "unet": SDUNet,
    "vae": SDVAEDecoder,
}


def _load(checkpoint: Checkpoint, component: str, dtype: Any) -> Any:
    """The network in ``dtype``, converted at load time as
    ``StableDiffusionPipeline.from_pretrained(torch_dtype=...)`` does."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    if component == "text_encoder":
        # PyTorch's fused attention, as the pipeline serves it (the ONNX export traces eager attention).
        return load_text_encoder(checkpoint, attention="sdpa", dtype=dtype)
    cls = UNet2DConditionModel if component == "unet" else AutoencoderKL
    return cls.from_pretrained(
        str(checkpoint.path), subfolder=component, dtype=dtype, local_files_only=True
    ).eval()


def _outputs(
    model: Any,
    component: str,
    feeds: dict[str, np.ndarray],
    names: list[str],
    device: Any,
    dtype: Any,
) -> np.ndarray:
    import torch

    tensors = [torch.from_numpy(feeds[n]).to(device) for n in names]
    tensors = [t.to(dtype) if t.is_floating_point() else t for t in tensors]
    with torch.inference_mode():
        if component == "text_encoder":
            out = model(tensors[0]).last_hidden_state
        elif component == "unet":
            out = model(
                tensors[0],
                tensors[1].reshape(-1),
                encoder_hidden_states=tensors[2],
                return_dict=False,
            )[0]
        else:
            out = model.decode(tensors[0], return_dict=False)[0]
    return out.float().cpu().numpy()  # type: ignore[no-any-return]


def produce_weights(
    checkpoint: Checkpoint, precision: str, device: str
) -> Callable[[Path, Callable[[str], None]], ProducedFiles]:
    """The ``produce`` step of ``stable_diffusion_torch``: converted, checked, saved weights.

    Args:
        precision: ``fp16`` (GPU hosts) or ``fp32``.
        device: where the check runs (``cuda`` on a GPU host: the FP16 kernels that will serve).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")

    def produce(workdir: Path, status: Callable[[str], None]) -> ProducedFiles:
        import torch

        dtype = torch.float16 if precision == "fp16" else torch.float32
        made = ProducedFiles(
            files={}, precision=precision, weights=checkpoint.weights_info("unet").__dict__
        )
        tolerance = TOLERANCES[precision]
        for component in COMPONENTS:
            status(f"stable_diffusion_torch: {component} to {precision.upper()} on {device}")
            started = time.perf_counter()
            spec = _SPECS[component](checkpoint)
            feeds = spec.sample_inputs()
            names = [t.name for t in spec.inputs]
            reference = _outputs(
                _load(checkpoint, component, torch.float32).to(device),
                component,
                feeds,
                names,
                device,
                torch.float32,
            )
            model = _load(checkpoint, component, dtype).to(device)
            candidate = _outputs(model, component, feeds, names, device, dtype)
            parity = compare(reference, candidate)
            failures = parity.failures(tolerance)
            if failures:
                raise ParityError(
                    f"stable_diffusion_torch: {component} in {precision.upper()} is outside its "
                    f"tolerance vs FP32: {'; '.join(failures)}"
                )
            gated = tolerance.max_abs_error if math.isfinite(tolerance.max_abs_error) else None
            made.parity[component] = {
                **parity.as_dict(),
                "tolerance": {"min_cosine": tolerance.min_cosine, "max_abs_error": gated},
            }
            target = workdir / component
            model.to("cpu").save_pretrained(str(target))
            made.files.update(
                {f"{component}/{p.name}": p for p in sorted(target.iterdir()) if p.is_file()}
            )
            made.timings_s[component] = time.perf_counter() - started
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        made.notes.append(
            f"text encoder, UNet and VAE in {precision.upper()} for the pipeline model's own process; "
            f"each checked against its FP32 module on {device} with the ONNX entries' sample inputs "
            f"(min cosine {tolerance.min_cosine})"
        )
        if checkpoint.random_init is not None:
            made.notes.append(f"weights: {checkpoint.weights_info('unet').note}")
        return made

    return produce
