"""Every model the builders know, by the name it has in the Triton repository."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from builders.errors import UnknownModelError
from builders.families import diffusion, efficientnet, image_pipeline, resnet, text_embedding
from builders.spec import AssetSpec, Spec

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_NETWORKS",
    "DEFAULT_STACK",
    "available",
    "get_spec",
    "resolve",
]

Factory = Callable[[Mapping[str, str]], Spec]

_FACTORIES: Mapping[str, Factory] = {
    "efficientnet_lite0": lambda weights: efficientnet.EfficientNetLite0(),
    "resnet50": lambda weights: resnet.ResNet50(weights.get("resnet50")),
    "image_preprocess": lambda weights: image_pipeline.preprocess_spec(
        efficientnet.EfficientNetLite0.preprocessing
    ),
    "image_postprocess": lambda weights: image_pipeline.postprocess_spec(),
    "image_classifier": lambda weights: image_pipeline.classifier_spec("efficientnet_lite0"),
    # GPU hosts: the same task in one GPU-resident model; needs the TorchScript entry beside it
    "image_classifier_gpu": lambda weights: image_pipeline.gpu_classifier_spec(
        efficientnet.EfficientNetLite0.preprocessing
    ),
    "minilm_encoder": lambda weights: text_embedding.MiniLMEncoder(),
    "text_tokenizer": lambda weights: text_embedding.tokenizer_spec(),
    "text_pooling": lambda weights: text_embedding.pooling_spec(),
    "text_embedding": lambda weights: text_embedding.embedding_spec(),
    "text_embedding_fp16": lambda weights: text_embedding.embedding_spec("fp16"),
    # Stable Diffusion: every entry reads one local checkpoint folder; none is built without it.
    "sd_text_encoder": lambda weights: diffusion.SDTextEncoder(
        diffusion.checkpoint_from(weights, "sd_text_encoder")
    ),
    "sd_unet": lambda weights: diffusion.SDUNet(diffusion.checkpoint_from(weights, "sd_unet")),
    "sd_vae_decoder": lambda weights: diffusion.SDVAEDecoder(
        diffusion.checkpoint_from(weights, "sd_vae_decoder")
    ),
    "stable_diffusion": lambda weights: diffusion.pipeline_spec(
        diffusion.checkpoint_from(weights, "stable_diffusion")
    ),
    "stable_diffusion_fp16": lambda weights: diffusion.pipeline_spec(
        diffusion.checkpoint_from(weights, "stable_diffusion_fp16"),
        unet="sd_unet_fp16",
        name="stable_diffusion_fp16",
    ),
    # GPU hosts: the networks in the pipeline's own process (FP16 on CUDA); built for the host it is built on
    "stable_diffusion_torch": lambda weights: diffusion.torch_pipeline_spec(
        diffusion.checkpoint_from(weights, "stable_diffusion_torch"), gpu=_cuda_available()
    ),
}


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


#: what ``inferctl build`` builds when not told otherwise (and what a push to main promotes from)
DEFAULT_MODELS: tuple[str, ...] = (
    "efficientnet_lite0",
    "resnet50",
    "image_classifier",
    "text_embedding",
)
#: what ``inferctl up`` builds and serves when not told otherwise: the default models plus image
#: generation, built from a named checkpoint folder or else a tiny random-init one (random weights,
#: served so ``/v1/images/generations`` works on a fresh stack; never promoted)
DEFAULT_STACK: tuple[str, ...] = (*DEFAULT_MODELS, "stable_diffusion")
#: the networks (not pipelines) ``DEFAULT_MODELS`` serve: what a push to main promotes (a pipeline is
#: not promoted; it calls whatever version of these is in production). A literal, so the workflow can
#: read it without installing anything; a test keeps it equal to what ``resolve`` finds.
DEFAULT_NETWORKS: tuple[str, ...] = ("efficientnet_lite0", "resnet50", "minilm_encoder")


def available() -> list[str]:
    return sorted(_FACTORIES)


def get_spec(name: str, weights: Mapping[str, str] | None = None) -> Spec:
    """The spec for ``name``.

    Raises:
        UnknownModelError: no family builds a model of that name.
    """
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownModelError(name, available()) from None
    return factory(weights or {})


def resolve(names: Iterable[str], weights: Mapping[str, str] | None = None) -> list[Spec]:
    """Specs for ``names`` plus what they require, dependencies first, each once."""
    ordered: dict[str, Spec] = {}

    def visit(name: str) -> None:
        if name in ordered:
            return
        spec = get_spec(name, weights)
        if isinstance(spec, AssetSpec):
            for dependency in spec.requires:
                visit(dependency)
        ordered[name] = spec

    for name in names:
        visit(name)
    return list(ordered.values())
