"""The pipeline entries clients call: prompt -> image, over the ONNX networks or with torch in process.

    stable_diffusion        (CPU hosts) the loop in a Python model, the networks as ONNX entries via BLS
    stable_diffusion_fp16   the same over sd_unet_fp16 (a GPU host's onnxruntime)
    stable_diffusion_torch  (GPU hosts) the networks in the pipeline model's own process with torch,
                            FP16 on CUDA; its version folder holds the converted weights

All read one checkpoint: its tokenizer and scheduler config are copied into the version folder, and
the model code is the same (``python_models/diffusion_*.py``). Concurrent requests are batched:
Triton's dynamic batcher hands the model up to ``pipeline_batch`` requests, which share UNet calls.
"""

from __future__ import annotations

from pathlib import Path

from builders.errors import BuildError
from builders.families.diffusion.checkpoint import COMPONENTS, PIPELINE, RANDOM_MARKER, Checkpoint
from builders.families.diffusion.networks import TEXT_ENCODER, UNET, VAE_DECODER
from builders.families.diffusion.torch_flavour import produce_weights
from builders.python_models.diffusion_request import GenerationLimits
from builders.spec import AssetSpec, BatchingPolicy, TensorSpec
from builders.triton_config import ConfigOptions, model_config
from serving.limits import DEFAULT_LIMITS, ImageGenerationLimits
from serving.model_card import ModelCard, Task

__all__ = ["FP16_PIPELINE", "TORCH_PIPELINE", "pipeline_spec", "torch_pipeline_spec"]

FP16_PIPELINE = "stable_diffusion_fp16"
TORCH_PIPELINE = "stable_diffusion_torch"
_MODELS = Path(__file__).resolve().parents[2] / "python_models"
_MODEL_FILES = {
    "model.py": "diffusion_pipeline.py",
    "diffusion_loop.py": "diffusion_loop.py",
    "diffusion_networks.py": "diffusion_networks.py",
    "diffusion_request.py": "diffusion_request.py",
    "diffusion_runtime.py": "diffusion_runtime.py",
}
#: how long the dynamic batcher holds a request for others to join its loop: a generation takes
#: seconds, clients that send together arrive within milliseconds of each other
QUEUE_DELAY_US = 10_000

_INPUTS = (
    (TensorSpec("PROMPT", "bytes", (1,)), False),
    (TensorSpec("NEGATIVE_PROMPT", "bytes", (1,)), True),
    (TensorSpec("STEPS", "int32", (1,)), True),
    (TensorSpec("GUIDANCE", "float32", (1,)), True),
    (TensorSpec("HEIGHT", "int32", (1,)), True),
    (TensorSpec("WIDTH", "int32", (1,)), True),
    (TensorSpec("SEED", "int64", (1,)), True),
    (TensorSpec("SCHEDULER", "bytes", (1,)), True),
)


def generation_limits(
    checkpoint: Checkpoint, limits: ImageGenerationLimits = DEFAULT_LIMITS.image_generation
) -> GenerationLimits:
    """The platform's limits as the pipeline model checks them, sized for this checkpoint."""
    return GenerationLimits(
        min_steps=limits.min_steps,
        max_steps=limits.max_steps,
        default_steps=limits.default_steps,
        min_side=limits.min_side,
        max_side=limits.max_side,
        side_multiple=max(limits.side_multiple, checkpoint.size_multiple),
        default_side=checkpoint.native_size,
        max_seed=limits.max_seed,
        min_guidance=limits.min_guidance,
        max_guidance=limits.max_guidance,
        default_guidance=limits.default_guidance,
        max_prompt_bytes=limits.max_prompt_bytes,
        schedulers=tuple(limits.schedulers),
    )


def _check_schedulers(checkpoint: Checkpoint, classes: dict[str, str]) -> None:
    from builders.python_models.diffusion_loop import Schedulers

    try:
        Schedulers(str(checkpoint.path / "scheduler" / "scheduler_config.json"), classes)
    except ValueError as exc:
        raise BuildError(
            f"stable_diffusion: the checkpoint {checkpoint.path}'s scheduler config cannot be used: {exc}"
        ) from exc


def _entry(
    name: str, checkpoint: Checkpoint, runtime_parameters: dict[str, str], gpu: bool
) -> tuple:
    """Config and files shared by every pipeline entry."""
    limits = DEFAULT_LIMITS.image_generation
    classes = dict(limits.schedulers)
    _check_schedulers(checkpoint, classes)
    unet, vae = checkpoint.config("unet"), checkpoint.config("vae")
    config = model_config(
        name,
        inputs=[t for t, _ in _INPUTS],
        outputs=[TensorSpec("IMAGE", "uint8", (-1, -1, 3))],
        # One pipeline: a second would hold a second copy of the networks (the torch runtime's are
        # in process, several GB for SD 1.5) and split concurrent requests that one loop batches. The
        # batcher's missed wake-up with one instance (triton_config.model_config) costs at most
        # 500 ms, against generations of seconds; the networks it calls keep two instances.
        batching=BatchingPolicy(
            max_batch_size=limits.pipeline_batch,
            max_queue_delay_us=QUEUE_DELAY_US,
            instance_count=1,
        ),
        options=ConfigOptions(
            backend="python",
            parameters={
                **runtime_parameters,
                "latent_channels": str(unet["in_channels"]),
                "vae_scale_factor": str(checkpoint.vae_scale_factor),
                "scaling_factor": str(vae.get("scaling_factor", 0.18215)),
                "scheduler_classes": ",".join(f"{k}={v}" for k, v in classes.items()),
                "random_init_checkpoint": "true" if checkpoint.random_init is not None else "false",
                **generation_limits(checkpoint, limits).parameters(),
                **ModelCard(name, task=Task.IMAGE_GENERATION).parameters(),
            },
            gpu=gpu,
            warmup=False,  # Triton cannot synthesise string inputs; the torch runtime warms itself up
        ),
    )
    for message, (_, optional) in zip(config.input, _INPUTS, strict=True):
        message.optional = optional
    files = {dest: _MODELS / source for dest, source in _MODEL_FILES.items()}
    files["scheduler/scheduler_config.json"] = (
        checkpoint.path / "scheduler" / "scheduler_config.json"
    )
    for path in sorted((checkpoint.path / "tokenizer").iterdir()):
        if path.is_file():
            files[f"tokenizer/{path.name}"] = path
    if checkpoint.random_init is not None:
        files[RANDOM_MARKER] = checkpoint.path / RANDOM_MARKER
    origin = (
        f"{checkpoint.random_init['preset']} random-init checkpoint"
        if checkpoint.random_init
        else str(checkpoint.path)
    )
    return config, files, origin


def pipeline_spec(checkpoint: Checkpoint, unet: str = UNET, name: str = PIPELINE) -> AssetSpec:
    """``stable_diffusion`` (``unet`` = ``sd_unet``) or ``stable_diffusion_fp16`` (``sd_unet_fp16``):
    the loop in a Python model calling the ONNX networks through BLS.

    Raises:
        BuildError: the checkpoint's scheduler config cannot be used by diffusers' schedulers.
    """
    parameters = {
        "runtime": "triton",
        "text_encoder_model": TEXT_ENCODER,
        "unet_model": unet,
        "vae_decoder_model": VAE_DECODER,
    }
    config, files, origin = _entry(name, checkpoint, parameters, gpu=False)
    return AssetSpec(
        name,
        "python",
        f"text -> image: the scheduler loop over Triton ({unet}; {origin})",
        config,
        files=files,
        requires=(TEXT_ENCODER, UNET, VAE_DECODER),
    )


def torch_pipeline_spec(
    checkpoint: Checkpoint, *, gpu: bool, precision: str | None = None
) -> AssetSpec:
    """``stable_diffusion_torch``: the networks in the pipeline model's process, FP16 on a GPU.

    Args:
        gpu: a ``KIND_GPU`` instance, FP16 and the weights' check on CUDA (build it on the serving
            host); otherwise ``KIND_CPU`` and FP32.
        precision: overrides FP16 on GPU / FP32 on CPU.
    """
    precision = precision or ("fp16" if gpu else "fp32")
    config, files, origin = _entry(
        TORCH_PIPELINE, checkpoint, {"runtime": "torch", "precision": precision}, gpu=gpu
    )
    sources = tuple(p for component in COMPONENTS for p in checkpoint.files(component))
    sources += (
        Path(__file__).with_name("torch_flavour.py"),
        Path(__file__).with_name("networks.py"),
    )
    return AssetSpec(
        TORCH_PIPELINE,
        "python",
        f"text -> image: the networks in process with torch, {precision.upper()} "
        f"({'GPU' if gpu else 'CPU'}; {origin})",
        config,
        files=files,
        produce=produce_weights(checkpoint, precision, "cuda" if gpu else "cpu"),
        sources=sources,
    )
