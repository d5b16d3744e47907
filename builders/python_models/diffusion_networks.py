"""Where the pipeline model's three networks run: in its own process with torch, or as Triton models.

- :class:`TorchNetworks` (GPU hosts): the checkpoint's text encoder, UNet and VAE loaded with their
  diffusers / transformers classes from the entry's version folder, in the precision they were
  published in, on the instance's GPU (or the CPU). No round trip through Triton per step.
- :class:`TritonNetworks` (CPU hosts): the ONNX entries ``sd_text_encoder``, ``sd_unet`` (or
  ``sd_unet_fp16``) and ``sd_vae_decoder``, called through BLS; tensors cross by DLPack.

Both take and return torch tensors on ``device`` in ``dtype``, so the loop is one code for both.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["TorchNetworks", "TritonNetworks"]


class TorchNetworks:
    """The networks in this process (what ``StableDiffusionPipeline.from_pretrained`` loads)."""

    def __init__(self, folder: str, device: torch.device, dtype: torch.dtype) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from transformers import CLIPTextModel

        self.device, self.dtype = device, dtype
        self.text_encoder = (
            CLIPTextModel.from_pretrained(
                os.path.join(folder, "text_encoder"), dtype=dtype, local_files_only=True
            )
            .to(device)  # type: ignore[arg-type]
            .eval()
        )
        self.unet_model = (
            UNet2DConditionModel.from_pretrained(
                folder, subfolder="unet", dtype=dtype, local_files_only=True
            )
            .to(device)
            .eval()
        )
        self.vae = (
            AutoencoderKL.from_pretrained(
                folder, subfolder="vae", dtype=dtype, local_files_only=True
            )
            .to(device)
            .eval()
        )
        self.time_cond_proj_dim = self.unet_model.config.time_cond_proj_dim

    def encode(self, input_ids: torch.Tensor) -> torch.Tensor:
        encoded = self.text_encoder(input_ids.to(self.device), attention_mask=None)
        return encoded[0]  # type: ignore[no-any-return]

    def unet(
        self, sample: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor:
        return self.unet_model(sample, timesteps, encoder_hidden_states=context, return_dict=False)[
            0
        ]  # type: ignore[no-any-return]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents, return_dict=False)[0]  # type: ignore[no-any-return]


class TritonNetworks:
    """The networks as Triton models of the same repository, called through BLS (FP32 on the CPU)."""

    device = torch.device("cpu")
    dtype = torch.float32
    time_cond_proj_dim = None

    def __init__(self, pb_utils: Any, text_encoder: str, unet: str, vae_decoder: str) -> None:
        self.pb = pb_utils
        self.models = {"text_encoder": text_encoder, "unet": unet, "vae_decoder": vae_decoder}

    def _run(self, role: str, feeds: dict[str, torch.Tensor], output: str) -> torch.Tensor:
        import torch.utils.dlpack

        request = self.pb.InferenceRequest(
            model_name=self.models[role],
            inputs=[
                self.pb.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(tensor.contiguous()))
                for name, tensor in feeds.items()
            ],
            requested_output_names=[output],
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{self.models[role]}: {response.error().message()}")
        tensor = self.pb.get_output_tensor_by_name(response, output)
        return torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).clone()

    def encode(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._run(
            "text_encoder", {"input_ids": input_ids.to(torch.int64)}, "last_hidden_state"
        )

    def unet(
        self, sample: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor:
        feeds = {
            "sample": sample.float(),
            "timestep": timesteps.float().reshape(-1, 1).expand(sample.shape[0], 1),
            "encoder_hidden_states": context.float(),
        }
        return self._run("unet", feeds, "noise_pred")

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self._run("vae_decoder", {"latents": latents.float()}, "image")
