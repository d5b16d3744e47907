"""Triton Python (BLS) model: prompt -> image, running the diffusers scheduler loop over Triton.

The text encoder, UNet and VAE decoder are separate Triton models; this model tokenizes, draws the
seeded initial latents, steps the checkpoint's scheduler and calls the three networks with
``pb_utils.InferenceRequest(...).exec()``.

Only numpy, torch (for ``torch.Generator`` noise, bit-identical to diffusers') and ``tokenizers`` are
needed in the Python backend: transformers and diffusers do not import inside Triton's Python stub
here (their hub client imports ``ssl``, which the stub's embedded interpreter cannot load), and the
NGC container does not ship them. So the CLIP tokenizer is rebuilt from ``vocab.json``/``merges.txt``
(or ``tokenizer.json``) as transformers builds it, and the scheduler (PNDM with PLMS steps, what SD
1.x checkpoints ship, or DDIM) is a line-by-line port of diffusers' float32 torch arithmetic.

The loop is :func:`generate`, written against three plain callables, so it can be checked outside Triton too; it follows
``diffusers.StableDiffusionPipeline.__call__`` step for step (same tokenization, the same CPU
``torch.Generator`` noise, classifier-free guidance with the negative prompt first, the same
post-processing), which is what makes the served image match the diffusers one for the same
weights, prompt and seed.

Inputs (max_batch_size 0, one image per request): PROMPT, and optional NEGATIVE_PROMPT (""),
STEPS (DEFAULT_STEPS), GUIDANCE (DEFAULT_GUIDANCE), HEIGHT/WIDTH (the checkpoint's native size) and
SEED (random when absent). A bad value is answered with INVALID_ARG naming the field.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_STEPS = 25
DEFAULT_GUIDANCE = 7.5
MAX_STEPS = 100
MAX_GUIDANCE = 30.0
MAX_PROMPT_BYTES = 4096

Runner = Callable[[dict[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Limits:
    size_multiple: int = 8
    default_size: int = 512
    max_size: int = 1024


@dataclass(frozen=True)
class Request:
    prompt: str
    negative_prompt: str = ""
    steps: int = DEFAULT_STEPS
    guidance: float = DEFAULT_GUIDANCE
    height: int = 512
    width: int = 512
    seed: int = 0


class InvalidRequest(ValueError):
    """A request field is out of range; the message names the field."""


def _text(raw: Any, field: str) -> str:
    value = bytes(raw) if isinstance(raw, bytes | bytearray | np.bytes_) else str(raw).encode()
    if len(value) > MAX_PROMPT_BYTES:
        raise InvalidRequest(f"{field} is {len(value)} bytes; at most {MAX_PROMPT_BYTES} are accepted")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{field} is not valid UTF-8") from exc


def validate(values: dict[str, np.ndarray | None], limits: Limits) -> Request:
    """Check the request tensors and fill defaults.

    Args:
        values: input name -> numpy array (``None`` for an optional input that was not sent).

    Raises:
        InvalidRequest: a field is missing, malformed or out of range; the message starts with its name.
    """

    def scalar(name: str) -> Any:
        array = values.get(name)
        if array is None:
            return None
        if array.size != 1:
            raise InvalidRequest(f"{name} must hold exactly one value, got shape {list(array.shape)}")
        return array.reshape(-1)[0]

    prompt = scalar("PROMPT")
    if prompt is None:
        raise InvalidRequest("PROMPT is required")
    negative = scalar("NEGATIVE_PROMPT")
    steps, guidance = scalar("STEPS"), scalar("GUIDANCE")
    height, width, seed = scalar("HEIGHT"), scalar("WIDTH"), scalar("SEED")

    steps = DEFAULT_STEPS if steps is None else int(steps)
    if not 1 <= steps <= MAX_STEPS:
        raise InvalidRequest(f"STEPS must be between 1 and {MAX_STEPS}, got {steps}")
    guidance = DEFAULT_GUIDANCE if guidance is None else float(guidance)
    if not (np.isfinite(guidance) and 0.0 <= guidance <= MAX_GUIDANCE):
        raise InvalidRequest(f"GUIDANCE must be between 0 and {MAX_GUIDANCE}, got {guidance}")
    sizes = {}
    for name, raw in (("HEIGHT", height), ("WIDTH", width)):
        size = limits.default_size if raw is None else int(raw)
        if size % limits.size_multiple or not limits.size_multiple <= size <= limits.max_size:
            raise InvalidRequest(
                f"{name} must be a multiple of {limits.size_multiple} between {limits.size_multiple} and "
                f"{limits.max_size}, got {size}"
            )
        sizes[name] = size
    seed = secrets.randbits(63) if seed is None else int(seed)
    if seed < 0:
        raise InvalidRequest(f"SEED must be >= 0, got {seed}")
    return Request(prompt=_text(prompt, "PROMPT"), negative_prompt="" if negative is None else _text(negative, "NEGATIVE_PROMPT"),
                   steps=steps, guidance=guidance, height=sizes["HEIGHT"], width=sizes["WIDTH"], seed=seed)


SUPPORTED_SCHEDULERS = ("PNDMScheduler", "DDIMScheduler")


def _betas(config: dict[str, Any]):  # type: ignore[no-untyped-def]
    import torch

    steps = int(config.get("num_train_timesteps", 1000))
    if config.get("trained_betas") is not None:
        return torch.tensor(config["trained_betas"], dtype=torch.float32)
    schedule = config.get("beta_schedule", "linear")
    start, end = float(config.get("beta_start", 0.0001)), float(config.get("beta_end", 0.02))
    if schedule == "linear":
        return torch.linspace(start, end, steps, dtype=torch.float32)
    if schedule == "scaled_linear":
        return torch.linspace(start**0.5, end**0.5, steps, dtype=torch.float32) ** 2
    raise ValueError(f"beta_schedule '{schedule}' is not supported")


def scheduler_problems(config: dict[str, Any]) -> list[str]:
    """Why a scheduler config cannot be run here (empty when it can); the builders check this."""
    problems = []
    name = config.get("_class_name")
    if name not in SUPPORTED_SCHEDULERS:
        problems.append(f"scheduler {name} (supported: {', '.join(SUPPORTED_SCHEDULERS)})")
    if config.get("beta_schedule", "linear") not in ("linear", "scaled_linear") and config.get("trained_betas") is None:
        problems.append(f"beta_schedule {config.get('beta_schedule')}")
    if config.get("prediction_type", "epsilon") not in ("epsilon", "v_prediction"):
        problems.append(f"prediction_type {config.get('prediction_type')}")
    if config.get("timestep_spacing", "leading") not in ("leading", "linspace", "trailing"):
        problems.append(f"timestep_spacing {config.get('timestep_spacing')}")
    if name == "PNDMScheduler" and not config.get("skip_prk_steps", False):
        problems.append("PNDMScheduler without skip_prk_steps (Runge-Kutta warm-up steps)")
    if name == "DDIMScheduler" and (config.get("thresholding") or config.get("rescale_betas_zero_snr")):
        problems.append("DDIMScheduler thresholding / rescale_betas_zero_snr")
    return problems


class _Scheduler:
    """What diffusers' scheduler of the same config computes, in the same float32 torch operations."""

    init_noise_sigma = 1.0

    def __init__(self, config: dict[str, Any]) -> None:
        import torch

        problems = scheduler_problems(config)
        if problems:
            raise ValueError("unsupported scheduler config: " + "; ".join(problems))
        self.config = config
        self.kind = config["_class_name"]
        self.train_steps = int(config.get("num_train_timesteps", 1000))
        self.offset = int(config.get("steps_offset", 0))
        self.spacing = config.get("timestep_spacing", "leading")
        self.prediction = config.get("prediction_type", "epsilon")
        alphas = 1.0 - _betas(config)
        self.alphas_cumprod = torch.cumprod(alphas, dim=0)
        default_one = self.kind == "DDIMScheduler"  # the two classes' defaults differ
        self.final_alpha_cumprod = (torch.tensor(1.0) if config.get("set_alpha_to_one", default_one)
                                    else self.alphas_cumprod[0])
        self.timesteps: Any = None
        self.steps = 0
        self.ets: list[Any] = []
        self.counter = 0
        self.cur_sample: Any = None

    def set_timesteps(self, steps: int) -> None:
        import torch

        self.steps = steps
        n, T = steps, self.train_steps
        if self.kind == "PNDMScheduler":
            if self.spacing == "linspace":
                base = np.linspace(0, T - 1, n).round().astype(np.int64)
            elif self.spacing == "leading":
                base = (np.arange(0, n) * (T // n)).round()
                base += self.offset
            else:
                base = np.round(np.arange(T, 0, -T / n))[::-1].astype(np.int64)
                base -= 1
            plms = np.concatenate([base[:-1], base[-2:-1], base[-1:]])[::-1].copy()
            timesteps = plms.astype(np.int64)
        else:
            if self.spacing == "linspace":
                timesteps = np.linspace(0, T - 1, n).round()[::-1].copy().astype(np.int64)
            elif self.spacing == "leading":
                timesteps = (np.arange(0, n) * (T // n)).round()[::-1].copy().astype(np.int64)
                timesteps += self.offset
            else:
                timesteps = np.round(np.arange(T, 0, -T / n)).astype(np.int64)
                timesteps -= 1
        self.timesteps = torch.from_numpy(timesteps)
        self.ets, self.counter, self.cur_sample = [], 0, None

    def scale_model_input(self, sample: Any, timestep: Any) -> Any:
        return sample

    def _alpha(self, timestep: Any) -> Any:
        return self.alphas_cumprod[timestep] if timestep >= 0 else self.final_alpha_cumprod

    def step(self, model_output: Any, timestep: Any, sample: Any) -> Any:
        if self.kind == "PNDMScheduler":
            return self._step_plms(model_output, timestep, sample)
        return self._step_ddim(model_output, timestep, sample)

    def _step_plms(self, model_output: Any, timestep: Any, sample: Any) -> Any:
        prev_timestep = timestep - self.train_steps // self.steps
        if self.counter != 1:
            self.ets = self.ets[-3:]
            self.ets.append(model_output)
        else:
            prev_timestep = timestep
            timestep = timestep + self.train_steps // self.steps
        if len(self.ets) == 1 and self.counter == 0:
            self.cur_sample = sample
        elif len(self.ets) == 1 and self.counter == 1:
            model_output = (model_output + self.ets[-1]) / 2
            sample = self.cur_sample
            self.cur_sample = None
        elif len(self.ets) == 2:
            model_output = (3 * self.ets[-1] - self.ets[-2]) / 2
        elif len(self.ets) == 3:
            model_output = (23 * self.ets[-1] - 16 * self.ets[-2] + 5 * self.ets[-3]) / 12
        else:
            model_output = (1 / 24) * (55 * self.ets[-1] - 59 * self.ets[-2] + 37 * self.ets[-3] - 9 * self.ets[-4])
        self.counter += 1
        return self._pndm_prev_sample(sample, timestep, prev_timestep, model_output)

    def _pndm_prev_sample(self, sample: Any, timestep: Any, prev_timestep: Any, model_output: Any) -> Any:
        alpha_prod_t = self.alphas_cumprod[timestep]
        alpha_prod_t_prev = self._alpha(prev_timestep)
        beta_prod_t = 1 - alpha_prod_t
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        if self.prediction == "v_prediction":
            model_output = (alpha_prod_t**0.5) * model_output + (beta_prod_t**0.5) * sample
        sample_coeff = (alpha_prod_t_prev / alpha_prod_t) ** (0.5)
        denom = alpha_prod_t * beta_prod_t_prev ** (0.5) + (alpha_prod_t * beta_prod_t * alpha_prod_t_prev) ** (0.5)
        return sample_coeff * sample - (alpha_prod_t_prev - alpha_prod_t) * model_output / denom

    def _step_ddim(self, model_output: Any, timestep: Any, sample: Any) -> Any:
        # eta = 0, as StableDiffusionPipeline calls it by default: deterministic.
        prev_timestep = timestep - self.train_steps // self.steps
        alpha_prod_t = self.alphas_cumprod[timestep]
        alpha_prod_t_prev = self._alpha(prev_timestep)
        beta_prod_t = 1 - alpha_prod_t
        if self.prediction == "epsilon":
            pred_original_sample = (sample - beta_prod_t ** (0.5) * model_output) / alpha_prod_t ** (0.5)
            pred_epsilon = model_output
        else:
            pred_original_sample = (alpha_prod_t**0.5) * sample - (beta_prod_t**0.5) * model_output
            pred_epsilon = (alpha_prod_t**0.5) * model_output + (beta_prod_t**0.5) * sample
        if self.config.get("clip_sample", True):
            limit = float(self.config.get("clip_sample_range", 1.0))
            pred_original_sample = pred_original_sample.clamp(-limit, limit)
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        variance = (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)
        std_dev_t = 0.0 * variance ** (0.5)
        pred_sample_direction = (1 - alpha_prod_t_prev - std_dev_t**2) ** (0.5) * pred_epsilon
        return alpha_prod_t_prev ** (0.5) * pred_original_sample + pred_sample_direction


def load_scheduler(path: str) -> _Scheduler:
    """A fresh scheduler for the checkpoint's ``scheduler_config.json`` (schedulers are stateful)."""
    with open(path, encoding="utf-8") as handle:
        return _Scheduler(json.load(handle))


def _merge(line: str) -> tuple[str, str]:
    left, right = line.split()
    return left, right


def _token_name(value: Any, default: str) -> str:
    if isinstance(value, dict):
        return str(value.get("content", default))
    return str(value) if value else default


class ClipTokenizer:
    """CLIP's byte-level BPE tokenizer, built with ``tokenizers`` exactly as transformers' CLIPTokenizer is.

    Called like the transformers tokenizer diffusers uses: padded to ``model_max_length`` with the pad
    token and truncated there, start and end tokens included.
    """

    def __init__(self, folder: str) -> None:
        from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import BPE

        settings: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    settings.update(json.load(handle))
        bos = _token_name(settings.get("bos_token"), "<|startoftext|>")
        eos = _token_name(settings.get("eos_token"), "<|endoftext|>")
        unk = _token_name(settings.get("unk_token"), "<|endoftext|>")
        pad = _token_name(settings.get("pad_token"), "<|endoftext|>")
        self.model_max_length = int(settings.get("model_max_length") or 77)
        if self.model_max_length > 10_000:  # transformers' "no limit" sentinel
            self.model_max_length = 77
        vocab_path, merges_path = os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt")
        if os.path.isfile(vocab_path) and os.path.isfile(merges_path):
            with open(vocab_path, encoding="utf-8") as handle:
                vocab = json.load(handle)
            with open(merges_path, encoding="utf-8") as handle:
                merges = [_merge(line) for line in handle.read().split("\n")
                          if line.strip() and not line.startswith("#version")]
            tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                      end_of_word_suffix="</w>", fuse_unk=False, unk_token=unk))
            tokenizer.normalizer = normalizers.Sequence(
                [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                                     behavior="removed", invert=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ])
            tokenizer.decoder = decoders.ByteLevel()
            tokenizer.add_special_tokens(list(dict.fromkeys([unk, bos, eos, pad])))
            eos_id, bos_id = tokenizer.token_to_id(eos), tokenizer.token_to_id(bos)
            if eos_id is None or bos_id is None:
                raise ValueError(f"the CLIP vocabulary lacks {bos} or {eos}")
            tokenizer.post_processor = processors.RobertaProcessing((eos, eos_id), (bos, bos_id), False, False)
        else:
            tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        tokenizer.enable_truncation(max_length=self.model_max_length)
        tokenizer.enable_padding(length=self.model_max_length, pad_id=tokenizer.token_to_id(pad), pad_token=pad)
        self._tokenizer = tokenizer

    def __call__(self, texts: list[str], **_: Any) -> Any:
        class Encoded:
            input_ids = np.array([e.ids for e in self._tokenizer.encode_batch(texts)], dtype=np.int64)

        return Encoded()


def generate(
    request: Request,
    *,
    tokenizer: Any,
    scheduler: Any,
    text_encoder: Runner,
    unet: Runner,
    vae_decoder: Runner,
    latent_channels: int,
    vae_scale_factor: int,
    scaling_factor: float,
) -> np.ndarray:
    """One image, uint8 [height, width, 3], as ``StableDiffusionPipeline`` computes it.

    Args:
        tokenizer: the checkpoint's CLIP tokenizer (:class:`ClipTokenizer`, or transformers' own).
        scheduler: a fresh scheduler from :func:`load_scheduler` (it is stepped in place).
        text_encoder: {"input_ids": int64 [n, 77]} -> last_hidden_state float32 [n, 77, d].
        unet: {"sample", "timestep" [n, 1], "encoder_hidden_states"} -> noise prediction.
        vae_decoder: {"latents"} -> image float32 [n, 3, H, W] in [-1, 1].
    """
    import torch

    guided = request.guidance > 1.0
    texts = [request.negative_prompt, request.prompt] if guided else [request.prompt]
    ids = tokenizer(texts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                    return_tensors="np").input_ids.astype(np.int64)
    context = text_encoder({"input_ids": ids}).astype(np.float32)

    scheduler.set_timesteps(request.steps)
    generator = torch.Generator(device="cpu").manual_seed(request.seed)
    shape = (1, latent_channels, request.height // vae_scale_factor, request.width // vae_scale_factor)
    latents = torch.randn(shape, generator=generator, dtype=torch.float32) * scheduler.init_noise_sigma

    for t in scheduler.timesteps:
        model_input = torch.cat([latents] * 2) if guided else latents
        model_input = scheduler.scale_model_input(model_input, t)
        timestep = np.full((model_input.shape[0], 1), float(t), dtype=np.float32)
        noise = torch.from_numpy(unet({"sample": model_input.numpy().astype(np.float32), "timestep": timestep,
                                       "encoder_hidden_states": context}))
        if guided:
            uncond, cond = noise.chunk(2)
            noise = uncond + request.guidance * (cond - uncond)
        latents = scheduler.step(noise, t, latents)

    decoded = torch.from_numpy(vae_decoder({"latents": (latents / scaling_factor).numpy().astype(np.float32)}))
    image = (decoded / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().numpy()
    return (image[0] * 255).round().astype(np.uint8)


class TritonPythonModel:
    """One request, one image; the three networks are called through Triton (BLS)."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        here = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = ClipTokenizer(os.path.join(here, "tokenizer"))
        self.scheduler_config = os.path.join(here, "scheduler", "scheduler_config.json")
        load_scheduler(self.scheduler_config)  # fail at load time, not on the first request
        self.models = {role: params[f"{role}_model"] for role in ("text_encoder", "unet", "vae_decoder")}
        self.limits = Limits(size_multiple=int(params["size_multiple"]), default_size=int(params["default_size"]),
                             max_size=int(params["max_size"]))
        self.latent_channels = int(params["latent_channels"])
        self.vae_scale_factor = int(params["vae_scale_factor"])
        self.scaling_factor = float(params["scaling_factor"])
        self.inputs = [i["name"] for i in config["input"]]

    def _runner(self, role: str, output: str) -> Runner:
        def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
            request = self.pb.InferenceRequest(
                model_name=self.models[role],
                inputs=[self.pb.Tensor(name, np.ascontiguousarray(array)) for name, array in feeds.items()],
                requested_output_names=[output],
            )
            response = request.exec()
            if response.has_error():
                raise RuntimeError(f"{self.models[role]}: {response.error().message()}")
            return self.pb.get_output_tensor_by_name(response, output).as_numpy()

        return run

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                values = {}
                for name in self.inputs:
                    tensor = self.pb.get_input_tensor_by_name(request, name)
                    values[name] = None if tensor is None else tensor.as_numpy()
                parsed = validate(values, self.limits)
            except InvalidRequest as exc:
                responses.append(self.pb.InferenceResponse(error=self.pb.TritonError(str(exc), self.pb.TritonError.INVALID_ARG)))
                continue
            try:
                image = generate(
                    parsed, tokenizer=self.tokenizer, scheduler=load_scheduler(self.scheduler_config),
                    text_encoder=self._runner("text_encoder", "last_hidden_state"),
                    unet=self._runner("unet", "noise_pred"),
                    vae_decoder=self._runner("vae_decoder", "image"),
                    latent_channels=self.latent_channels, vae_scale_factor=self.vae_scale_factor,
                    scaling_factor=self.scaling_factor,
                )
                responses.append(self.pb.InferenceResponse([self.pb.Tensor("IMAGE", image)]))
            except RuntimeError as exc:  # a component model failed: a server-side error, not the client's
                responses.append(self.pb.InferenceResponse(error=self.pb.TritonError(f"stable_diffusion: {exc}")))
        return responses
