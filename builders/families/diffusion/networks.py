"""The three networks of a Stable Diffusion checkpoint as ONNX entries, for the BLS pipeline.

    sd_text_encoder (CLIP text model)  input_ids [N, 77] -> last_hidden_state [N, 77, D]
    sd_unet         sample, timestep [N, 1], encoder_hidden_states -> noise_pred   (+ sd_unet_fp16)
    sd_vae_decoder  latents [N, 4, h, w] -> image [N, 3, H, W] in [-1, 1]

Each is loaded with the diffusers / transformers class the checkpoint names, exported, and checked
against that PyTorch module on real inputs (the text encoder's embeddings of real prompts, seeded
latents). A UNet over 2 GiB (SD 1.5 in FP32 is 3.4 GB) is published with its ONNX external data.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from builders.evaluation import Evaluation, OutputParity
from builders.families.diffusion.checkpoint import Checkpoint
from builders.spec import BatchingPolicy, ModelSpec, TensorSpec, Tolerance
from serving.limits import DEFAULT_LIMITS
from serving.model_card import internal_parameters

__all__ = [
    "SAMPLE_PROMPTS",
    "TEXT_ENCODER",
    "UNET",
    "VAE_DECODER",
    "SDTextEncoder",
    "SDUNet",
    "SDVAEDecoder",
    "load_text_encoder",
    "tokenize",
]

TEXT_ENCODER, UNET, VAE_DECODER = "sd_text_encoder", "sd_unet", "sd_vae_decoder"
#: requests the pipeline runs in one loop; with classifier-free guidance the UNet sees twice as many rows
_PIPELINE_BATCH = DEFAULT_LIMITS.image_generation.pipeline_batch

#: prompts for parity checks (the text encoder's samples; the UNet is checked on their embeddings)
SAMPLE_PROMPTS: tuple[str, ...] = (
    "a photograph of an astronaut riding a horse",
    "a watercolor painting of a lighthouse at dawn",
    "",
    "a bowl of ramen, studio lighting, highly detailed",
)


class _SDComponent(ModelSpec):
    family = "diffusion"
    component: str
    # One pipeline loop of up to _PIPELINE_BATCH requests, guided: the text encoder and the UNet see
    # a negative-prompt row beside each prompt row, twice as many rows as requests.
    batching = BatchingPolicy(max_batch_size=2 * _PIPELINE_BATCH, max_queue_delay_us=1000)

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        # inputs_hash reads ``weights``; the component's files are hashed through source_files.
        self.weights = str(checkpoint.path)

    def source_files(self) -> list[Path]:
        return [*super().source_files(), *self.checkpoint.files(self.component)]

    def model_parameters(self) -> dict[str, str]:
        # Steps of the BLS pipeline: never listed to clients as models of their own.
        return {"intra_op_thread_count": "0", "inter_op_thread_count": "1", **internal_parameters()}

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng(1234)

    def _load_diffusers(self, class_name: str):  # type: ignore[no-untyped-def]
        """The component as diffusers' ``class_name`` loads it from its sub-folder, wrapped for tracing."""
        import diffusers

        model = (
            getattr(diffusers, class_name)
            .from_pretrained(
                str(self.checkpoint.path), subfolder=self.component, local_files_only=True
            )
            .eval()
        )
        return _wrap(model, self.component), self.checkpoint.weights_info(self.component)

    def evaluation(self) -> Evaluation:
        # The samples are drawn from a fixed seed (and real prompts): pixel / PSNR parity with production.
        return Evaluation(
            metric=OutputParity(output=self.outputs[0].name), inputs=self.sample_inputs()
        )


def _wrap(model: object, kind: str):  # type: ignore[no-untyped-def]
    """The network behind a plain-tensor ``forward``, as the traced graph takes it."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            if kind == "text_encoder":
                # No attention mask: diffusers' pipeline calls CLIP this way unless use_attention_mask is set.
                return self.model(tensors[0]).last_hidden_state  # type: ignore[operator]
            if kind == "unet":
                sample, timestep, context = tensors
                # Triton hands the batched timestep as [N, 1]; the UNet wants one per sample, [N].
                return self.model(
                    sample,
                    timestep.reshape(-1),
                    encoder_hidden_states=context,  # type: ignore[operator]
                    return_dict=False,
                )[0]
            return self.model.decode(tensors[0], return_dict=False)[0]  # type: ignore[attr-defined]

    return Wrapped().eval()


def tokenize(checkpoint: Checkpoint, prompts: tuple[str, ...]) -> np.ndarray:
    """Token ids [len(prompts), 77] as diffusers' pipeline makes them (padded to the maximum length)."""
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(
        str(checkpoint.path / "tokenizer"), local_files_only=True
    )
    ids = tokenizer(
        list(prompts),
        padding="max_length",
        max_length=checkpoint.max_text_length,
        truncation=True,
        return_tensors="np",
    ).input_ids
    return ids.astype(np.int64)


def load_text_encoder(  # type: ignore[no-untyped-def]
    checkpoint: Checkpoint, attention: str = "eager", dtype: object = None
):
    """The checkpoint's CLIP text model; eager attention traces to plain MatMul/Softmax."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import CLIPTextModel

    return CLIPTextModel.from_pretrained(
        str(checkpoint.path / "text_encoder"),
        local_files_only=True,
        attn_implementation=attention,
        dtype=dtype,
    ).eval()


class SDTextEncoder(_SDComponent):
    name = TEXT_ENCODER
    component = "text_encoder"
    description = "Stable Diffusion CLIP text encoder (local diffusers checkpoint)"
    tolerance = Tolerance(max_abs_error=1e-3, min_cosine=0.99999)

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        hidden = int(checkpoint.config("text_encoder")["hidden_size"])
        length = checkpoint.max_text_length
        self.inputs = (TensorSpec("input_ids", "int64", (length,)),)
        self.outputs = (TensorSpec("last_hidden_state", "float32", (length, hidden)),)

    def load(self):  # type: ignore[no-untyped-def]
        return _wrap(
            load_text_encoder(self.checkpoint), "text_encoder"
        ), self.checkpoint.weights_info("text_encoder")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"input_ids": tokenize(self.checkpoint, SAMPLE_PROMPTS)}


class SDUNet(_SDComponent):
    name = UNET
    component = "unet"
    description = "Stable Diffusion UNet noise predictor (local diffusers checkpoint)"
    tolerance = Tolerance(max_abs_error=2e-3, min_cosine=0.9999)
    #: ``sd_unet_fp16``: the graph in FP16 (inputs and outputs stay FP32), checked like the FP32 one
    variants = ("fp16",)
    #: the timestep embedding stays FP32: sinusoids of timesteps up to 1000 need it (diffusers
    #: computes it in FP32 too); "/model/Cast" is its cast to the sample's dtype, between the two
    fp16_keep_float = ("/time_proj/", "/time_embedding/", "/model/Cast")

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        unet = checkpoint.config("unet")
        channels = int(unet["in_channels"])
        context = int(unet["cross_attention_dim"])
        self.inputs = (
            TensorSpec("sample", "float32", (channels, -1, -1)),
            TensorSpec("timestep", "float32", (1,)),
            TensorSpec("encoder_hidden_states", "float32", (checkpoint.max_text_length, context)),
        )
        self.outputs = (TensorSpec("noise_pred", "float32", (int(unet["out_channels"]), -1, -1)),)

    def load(self):  # type: ignore[no-untyped-def]
        return self._load_diffusers("UNet2DConditionModel")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        import torch

        # Real conditioning: the text encoder's embeddings of real prompts, on seeded noise latents.
        encoder = load_text_encoder(self.checkpoint)
        with torch.inference_mode():
            context = encoder(
                torch.from_numpy(tokenize(self.checkpoint, SAMPLE_PROMPTS[:2]))
            ).last_hidden_state.numpy()
        side = int(self.checkpoint.config("unet").get("sample_size") or 64)
        if side % self.checkpoint.unet_down_factor == 0:
            # Trace where the up-blocks must resize to their skip connections, so the graph is exact
            # for latent sizes the down-sampling does not divide (see Checkpoint.size_multiple).
            side += 1
        sample = (
            self._rng().standard_normal((2, self.inputs[0].dims[0], side, side)).astype(np.float32)
        )
        return {
            "sample": sample,
            "timestep": np.array([[981.0], [1.0]], dtype=np.float32),
            "encoder_hidden_states": context.astype(np.float32),
        }


class SDVAEDecoder(_SDComponent):
    name = VAE_DECODER
    component = "vae"
    description = (
        "Stable Diffusion VAE decoder, latents -> image in [-1, 1] (local diffusers checkpoint)"
    )
    tolerance = Tolerance(max_abs_error=2e-3, min_cosine=0.9999)
    # Guidance is combined before decoding: one latent per request.
    batching = BatchingPolicy(max_batch_size=_PIPELINE_BATCH, max_queue_delay_us=1000)

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        vae = checkpoint.config("vae")
        self.inputs = (TensorSpec("latents", "float32", (int(vae["latent_channels"]), -1, -1)),)
        self.outputs = (TensorSpec("image", "float32", (int(vae.get("out_channels", 3)), -1, -1)),)

    def load(self):  # type: ignore[no-untyped-def]
        return self._load_diffusers("AutoencoderKL")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        vae = self.checkpoint.config("vae")
        side = int(self.checkpoint.config("unet").get("sample_size") or 64)
        # What the pipeline hands the decoder: unit-variance latents divided by the scaling factor.
        latents = self._rng().standard_normal((2, self.inputs[0].dims[0], side, side)) / float(
            vae.get("scaling_factor", 0.18215)
        )
        return {"latents": latents.astype(np.float32)}
