"""Stable Diffusion (diffusers) as three ONNX models and one Triton BLS pipeline model.

    stable_diffusion (Python BLS, max_batch_size 0)
        PROMPT, NEGATIVE_PROMPT, STEPS, GUIDANCE, HEIGHT, WIDTH, SEED -> IMAGE uint8 [H, W, 3]
        tokenizer + scheduler loop in the BLS model; each network call goes through Triton:
        -> sd_text_encoder (CLIP text model)  input_ids [N, 77] -> last_hidden_state [N, 77, D]
        -> sd_unet          sample, timestep, encoder_hidden_states -> noise_pred (CFG as batch 2)
        -> sd_vae_decoder   latents [N, 4, h, w] -> image [N, 3, H, W]

Every entry is built from one local diffusers checkpoint folder (``model_index.json``,
``text_encoder/``, ``tokenizer/``, ``unet/``, ``vae/``, ``scheduler/``), named with
``inferctl build stable_diffusion --weights stable_diffusion=PATH`` or ``SD_CHECKPOINT``. There is
no silent fallback: without a folder the build stops with :class:`MissingInputError` before anything
is written. Tests make a tiny, seeded, randomly initialised checkpoint with
:func:`write_tiny_checkpoint`; it carries a ``TINY_RANDOM.json`` marker, and the build reports of
entries built from it say ``pretrained: false`` with the seed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

import numpy as np

from builders.errors import BuildError, MissingInputError
from builders.python_models.diffusion_pipeline import scheduler_problems
from builders.report import file_sha256
from builders.spec import AssetSpec, BatchingPolicy, ModelSpec, TensorSpec, Tolerance, WeightsInfo
from builders.triton_config import model_config

__all__ = [
    "CHECKPOINT_ENV",
    "PIPELINE",
    "SAMPLE_PROMPTS",
    "TINY_MARKER",
    "Checkpoint",
    "SDTextEncoder",
    "SDUNet",
    "SDVAEDecoder",
    "checkpoint_from",
    "pipeline_spec",
    "write_tiny_checkpoint",
]

_MODELS = Path(__file__).resolve().parent.parent / "python_models"
CHECKPOINT_ENV = "SD_CHECKPOINT"
PIPELINE = "stable_diffusion"
TEXT_ENCODER, UNET, VAE_DECODER = "sd_text_encoder", "sd_unet", "sd_vae_decoder"
TINY_MARKER = "TINY_RANDOM.json"
#: largest HEIGHT/WIDTH the pipeline accepts (a 1024x1024 SD 1.x image is 16 GB of UNet activations on CPU)
MAX_SIZE = 1024

#: prompts for parity checks (the text encoder's samples; the UNet is checked on their embeddings)
SAMPLE_PROMPTS: tuple[str, ...] = (
    "a photograph of an astronaut riding a horse",
    "a watercolor painting of a lighthouse at dawn",
    "",
    "a bowl of ramen, studio lighting, highly detailed",
)

_REQUIRED = (
    "model_index.json",
    "text_encoder/config.json",
    "unet/config.json",
    "vae/config.json",
    "scheduler/scheduler_config.json",
    "tokenizer/tokenizer_config.json",
)


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin")) if folder.is_dir() else []


class Checkpoint:
    """A local diffusers Stable Diffusion checkpoint folder, checked before anything is built."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        if not self.path.exists():
            raise MissingInputError(f"stable_diffusion checkpoint folder not found: {self.path}")
        if not self.path.is_dir():
            raise MissingInputError(f"stable_diffusion checkpoint must be a diffusers folder, not a file: {self.path}")
        missing = [name for name in _REQUIRED if not (self.path / name).is_file()]
        missing += [f"{sub}/*.safetensors" for sub in ("text_encoder", "unet", "vae") if not _weight_files(self.path / sub)]
        tokenizer = self.path / "tokenizer"
        if not ((tokenizer / "tokenizer.json").is_file() or
                ((tokenizer / "vocab.json").is_file() and (tokenizer / "merges.txt").is_file())):
            missing.append("tokenizer/vocab.json+merges.txt (or tokenizer.json)")
        if missing:
            raise MissingInputError(
                f"stable_diffusion checkpoint {self.path} is not a complete diffusers folder; missing: {', '.join(missing)}"
            )

    def config(self, component: str) -> dict:
        name = "scheduler_config.json" if component == "scheduler" else "config.json"
        return json.loads((self.path / component / name).read_text(encoding="utf-8"))

    @cached_property
    def tiny(self) -> dict | None:
        marker = self.path / TINY_MARKER
        return json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else None

    def weights_info(self, component: str) -> WeightsInfo:
        files = _weight_files(self.path / component)
        first = files[0]
        if self.tiny is not None:
            return WeightsInfo(source="random-init", pretrained=False, path=str(self.path),
                               sha256=file_sha256(first),
                               note=f"tiny random Stable Diffusion test checkpoint (seed {self.tiny.get('seed')}); "
                                    "images mean nothing")
        return WeightsInfo(source=f"file:{self.path}", pretrained=True, path=str(self.path / component / first.name),
                           sha256=file_sha256(first))

    def files(self, component: str) -> list[Path]:
        """Files whose content makes ``component`` what it is (config and weights)."""
        folder = self.path / component
        return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".txt", ".safetensors", ".bin"))

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.config("vae")["block_out_channels"]) - 1)

    @property
    def size_multiple(self) -> int:
        """HEIGHT/WIDTH must be multiples of this: 8, and whole latents (the VAE's scale factor).

        Latents need not divide by the UNet's own down-sampling factor: the UNet is traced on a
        latent size that does not, so its graph carries diffusers' ``upsample_size`` path, which
        resizes each up-block to its skip connection and is exact for every size.
        """
        return max(8, self.vae_scale_factor)

    @property
    def unet_down_factor(self) -> int:
        return 2 ** (len(self.config("unet")["block_out_channels"]) - 1)

    @property
    def max_text_length(self) -> int:
        tokenizer = json.loads((self.path / "tokenizer" / "tokenizer_config.json").read_text(encoding="utf-8"))
        return int(tokenizer.get("model_max_length") or self.config("text_encoder").get("max_position_embeddings", 77))


def checkpoint_from(weights: Mapping[str, str], name: str) -> Checkpoint:
    """The checkpoint for ``name``: ``--weights name=PATH``, ``--weights stable_diffusion=PATH``, or ``SD_CHECKPOINT``.

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


# --------------------------------------------------------------------------------------------------
# The three networks
# --------------------------------------------------------------------------------------------------


class _SDComponent(ModelSpec):
    family = "diffusion"
    component: str

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        # inputs_hash reads ``weights``; the component's files are hashed through source_files.
        self.weights = str(checkpoint.path)

    def source_files(self) -> list[Path]:
        return [*super().source_files(), *self.checkpoint.files(self.component)]

    def model_parameters(self) -> dict[str, str]:
        return {"intra_op_thread_count": "0", "inter_op_thread_count": "1"}

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng(1234)


class _Wrapped:
    """Plain-tensor ``forward`` signatures for the traced graphs."""

    @staticmethod
    def text_encoder(model):  # type: ignore[no-untyped-def]
        import torch

        class TextEncoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
                # No attention mask: diffusers' pipeline calls CLIP this way unless use_attention_mask is set.
                return self.model(input_ids).last_hidden_state

        return TextEncoder().eval()

    @staticmethod
    def unet(model):  # type: ignore[no-untyped-def]
        import torch

        class UNet(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
                # Triton hands the batched timestep as [N, 1]; the UNet wants one per sample, [N].
                return self.model(sample, timestep.reshape(-1), encoder_hidden_states=encoder_hidden_states,
                                  return_dict=False)[0]

        return UNet().eval()

    @staticmethod
    def vae_decoder(model):  # type: ignore[no-untyped-def]
        import torch

        class VAEDecoder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, latents: torch.Tensor) -> torch.Tensor:
                return self.model.decode(latents, return_dict=False)[0]

        return VAEDecoder().eval()


def _tokenize(checkpoint: Checkpoint, prompts: tuple[str, ...]) -> np.ndarray:
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(str(checkpoint.path / "tokenizer"), local_files_only=True)
    ids = tokenizer(list(prompts), padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                    return_tensors="np").input_ids
    return ids.astype(np.int64)


def _load_text_encoder(checkpoint: Checkpoint):  # type: ignore[no-untyped-def]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import CLIPTextModel

    # Eager attention traces to plain MatMul/Softmax, and is what the diffusers reference computes too.
    return CLIPTextModel.from_pretrained(str(checkpoint.path / "text_encoder"), local_files_only=True,
                                         attn_implementation="eager").eval()


class SDTextEncoder(_SDComponent):
    name = TEXT_ENCODER
    component = "text_encoder"
    description = "Stable Diffusion CLIP text encoder (local diffusers checkpoint)"
    tolerance = Tolerance(max_abs_error=1e-3, min_cosine=0.99999)
    # A BLS request sends prompt + negative prompt as one batch of 2.
    batching = BatchingPolicy(max_batch_size=8, preferred_batch_sizes=(2, 4), max_queue_delay_us=1000)

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        hidden = int(checkpoint.config("text_encoder")["hidden_size"])
        length = checkpoint.max_text_length
        self.inputs = (TensorSpec("input_ids", "int64", (length,)),)
        self.outputs = (TensorSpec("last_hidden_state", "float32", (length, hidden)),)

    def load(self):  # type: ignore[no-untyped-def]
        return _Wrapped.text_encoder(_load_text_encoder(self.checkpoint)), self.checkpoint.weights_info("text_encoder")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        return {"input_ids": _tokenize(self.checkpoint, SAMPLE_PROMPTS)}


class SDUNet(_SDComponent):
    name = UNET
    component = "unet"
    description = "Stable Diffusion UNet noise predictor (local diffusers checkpoint)"
    tolerance = Tolerance(max_abs_error=2e-3, min_cosine=0.9999)
    # Classifier-free guidance runs cond + uncond as batch 2; two requests in flight fill 4.
    batching = BatchingPolicy(max_batch_size=4, preferred_batch_sizes=(2, 4), max_queue_delay_us=1000)

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
        from diffusers import UNet2DConditionModel

        model = UNet2DConditionModel.from_pretrained(str(self.checkpoint.path), subfolder="unet",
                                                     local_files_only=True).eval()
        return _Wrapped.unet(model), self.checkpoint.weights_info("unet")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        import torch

        # Real conditioning: the text encoder's embeddings of real prompts, on seeded noise latents.
        encoder = _load_text_encoder(self.checkpoint)
        with torch.inference_mode():
            context = encoder(torch.from_numpy(_tokenize(self.checkpoint, SAMPLE_PROMPTS[:2]))).last_hidden_state.numpy()
        side = int(self.checkpoint.config("unet").get("sample_size") or 64)
        if side % self.checkpoint.unet_down_factor == 0:
            # Trace where the up-blocks must resize to their skip connections, so the graph is exact
            # for latent sizes the down-sampling does not divide (see Checkpoint.size_multiple).
            side += 1
        sample = self._rng().standard_normal((2, self.inputs[0].dims[0], side, side)).astype(np.float32)
        return {"sample": sample, "timestep": np.array([[981.0], [1.0]], dtype=np.float32),
                "encoder_hidden_states": context.astype(np.float32)}


class SDVAEDecoder(_SDComponent):
    name = VAE_DECODER
    component = "vae"
    description = "Stable Diffusion VAE decoder, latents -> image in [-1, 1] (local diffusers checkpoint)"
    tolerance = Tolerance(max_abs_error=2e-3, min_cosine=0.9999)
    batching = BatchingPolicy(max_batch_size=4, max_queue_delay_us=1000)

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        vae = checkpoint.config("vae")
        self.inputs = (TensorSpec("latents", "float32", (int(vae["latent_channels"]), -1, -1)),)
        self.outputs = (TensorSpec("image", "float32", (int(vae.get("out_channels", 3)), -1, -1)),)

    def load(self):  # type: ignore[no-untyped-def]
        from diffusers import AutoencoderKL

        model = AutoencoderKL.from_pretrained(str(self.checkpoint.path), subfolder="vae", local_files_only=True).eval()
        return _Wrapped.vae_decoder(model), self.checkpoint.weights_info("vae")

    def sample_inputs(self) -> dict[str, np.ndarray]:
        vae = self.checkpoint.config("vae")
        side = int(self.checkpoint.config("unet").get("sample_size") or 64)
        # What the pipeline hands the decoder: unit-variance latents divided by the scaling factor.
        latents = self._rng().standard_normal((2, self.inputs[0].dims[0], side, side)) / float(vae.get("scaling_factor", 0.18215))
        return {"latents": latents.astype(np.float32)}


# --------------------------------------------------------------------------------------------------
# The BLS pipeline model
# --------------------------------------------------------------------------------------------------


def pipeline_spec(checkpoint: Checkpoint) -> AssetSpec:
    """``stable_diffusion``: the Python BLS model, with the checkpoint's tokenizer and scheduler config."""
    tensors = [
        (TensorSpec("PROMPT", "bytes", (1,)), False),
        (TensorSpec("NEGATIVE_PROMPT", "bytes", (1,)), True),
        (TensorSpec("STEPS", "int32", (1,)), True),
        (TensorSpec("GUIDANCE", "float32", (1,)), True),
        (TensorSpec("HEIGHT", "int32", (1,)), True),
        (TensorSpec("WIDTH", "int32", (1,)), True),
        (TensorSpec("SEED", "int64", (1,)), True),
    ]
    problems = scheduler_problems(checkpoint.config("scheduler"))
    if problems:
        raise BuildError(f"stable_diffusion: the checkpoint {checkpoint.path} has an unsupported " + "; ".join(problems)
                         + " (switch the checkpoint's scheduler_config.json to PNDM or DDIM)")
    unet, vae = checkpoint.config("unet"), checkpoint.config("vae")
    default_size = int(unet.get("sample_size") or 64) * checkpoint.vae_scale_factor
    config = model_config(
        PIPELINE, backend="python",
        inputs=[t for t, _ in tensors],
        outputs=[TensorSpec("IMAGE", "uint8", (-1, -1, 3))],
        batching=BatchingPolicy(max_batch_size=0),
        parameters={
            "text_encoder_model": TEXT_ENCODER,
            "unet_model": UNET,
            "vae_decoder_model": VAE_DECODER,
            "latent_channels": str(unet["in_channels"]),
            "vae_scale_factor": str(checkpoint.vae_scale_factor),
            "scaling_factor": str(vae.get("scaling_factor", 0.18215)),
            "size_multiple": str(checkpoint.size_multiple),
            "default_size": str(default_size),
            "max_size": str(MAX_SIZE),
            "tiny_random_checkpoint": "true" if checkpoint.tiny is not None else "false",
        },
        warmup=False,
    )
    for message, (_, optional) in zip(config.input, tensors, strict=True):
        message.optional = optional
    files = {"model.py": _MODELS / "diffusion_pipeline.py",
             "scheduler/scheduler_config.json": checkpoint.path / "scheduler" / "scheduler_config.json"}
    for path in sorted((checkpoint.path / "tokenizer").iterdir()):
        if path.is_file():
            files[f"tokenizer/{path.name}"] = path
    if checkpoint.tiny is not None:
        files[TINY_MARKER] = checkpoint.path / TINY_MARKER
    origin = "tiny random test checkpoint" if checkpoint.tiny is not None else str(checkpoint.path)
    return AssetSpec(PIPELINE, "python", f"text -> image: CLIP tokenizer + scheduler loop over Triton ({origin})",
                     config, files=files, requires=(TEXT_ENCODER, UNET, VAE_DECODER))


# --------------------------------------------------------------------------------------------------
# A tiny checkpoint for tests
# --------------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's byte -> printable character table (the byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
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
    for pair in ("t h", "th e</w>", "a n", "i n", "o n</w>", "e r", "a t", "e d</w>", "o f</w>", "in g</w>"):
        left, right = pair.split(" ")
        merges.append((left, right))
        vocab.setdefault(left + right, len(vocab))
    return vocab, merges


def write_tiny_checkpoint(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Save a tiny randomly initialised ``StableDiffusionPipeline`` (seeded, deterministic) to ``path``.

    UNet with block_out_channels (32, 64), a 2-layer CLIP text model of width 32, a 2-level VAE and
    a PNDM scheduler configured as Stable Diffusion 1.x ships it; saved with ``save_pretrained``, so
    it is read back exactly as a real checkpoint folder is.
    """
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    target = Path(path)
    vocab, merges = _tiny_vocabulary()
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)  # type: ignore[arg-type]
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32,
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"), up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        norm_num_groups=32, sample_size=64,
    )
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, layer_norm_eps=1e-5,
    ))
    scheduler = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                              skip_prk_steps=True, set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(str(target), safe_serialization=True)  # type: ignore[attr-defined]
    # Lay the tokenizer out as real SD 1.x checkpoints do (vocab.json + merges.txt, no tokenizer.json),
    # so tests exercise the files production reads.
    tokenizer_dir = target / "tokenizer"
    (tokenizer_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (tokenizer_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                              encoding="utf-8")
    (tokenizer_dir / "tokenizer.json").unlink(missing_ok=True)
    (target / TINY_MARKER).write_text(json.dumps({"seed": seed, "note": "random weights for tests"}) + "\n",
                                      encoding="utf-8")
    return target
