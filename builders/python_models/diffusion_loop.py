"""The denoising loop of the Stable Diffusion pipeline model: batched across requests, diffusers' schedulers.

    rows of one HEIGHT x WIDTH (a cohort) run as one loop, every step ONE UNet call:
        lanes: rows of the same scheduler, steps and guidance scale; one diffusers scheduler each
        UNet batch: per lane [its rows unguided (negative prompt) | its rows guided (prompt)],
                    each row with its lane's timestep
        then per lane: uncond + scale * (cond - uncond), and the lane's scheduler steps its rows
    a lane that has taken its last step is decoded by the VAE and handed back at once (``done``).

Lanes of different step counts or schedulers run side by side in the same UNet calls; a lane of
fewer steps leaves the batch when it is done. Per request this is ``StableDiffusionPipeline.__call__``
step for step: the same tokenization, prompt embeddings, noise (a CPU ``torch.Generator`` per image
through diffusers' ``randn_tensor``), ``scale_model_input``, guidance arithmetic,
``prepare_extra_step_kwargs`` (``eta`` 0, the per-image generators), VAE scaling and
post-processing. A lone request is bit for bit what the pipeline computes on the same device; in a
batch, only kernel choices that depend on the batch size can move its values.

Schedulers are diffusers' own classes, built as users build them:
``Class.from_config(pipeline.scheduler.config)`` from the checkpoint's ``scheduler_config.json``.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from builders.python_models.diffusion_request import Request

__all__ = ["Lane", "Networks", "PipelineParts", "Schedulers", "generate", "lanes_of"]

#: ``done(keys, images)``: the rows of one finished lane, images uint8 [n, H, W, 3] on the CPU
Done = Callable[[list[Hashable], torch.Tensor], None]


class Networks(Protocol):
    """The three networks, taking and returning torch tensors on ``device`` in ``dtype``."""

    device: torch.device
    dtype: torch.dtype

    def encode(self, input_ids: torch.Tensor) -> torch.Tensor: ...  # [n, 77] int64 -> [n, 77, d]

    def unet(
        self, sample: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor: ...

    def decode(
        self, latents: torch.Tensor
    ) -> torch.Tensor: ...  # scaled latents -> image in [-1, 1]


def _usable_scipy() -> None:
    """Let diffusers do without scipy where scipy cannot be imported.

    diffusers imports ``scipy.stats`` with its Euler and DPM-Solver schedulers when scipy is
    installed, for an option (beta sigmas) we never set. A scipy built for another numpy (a GPU
    host's numpy 2 scipy beside the numpy 1 that Triton 2.51's Python stub needs) fails that import
    and would take every scheduler down with it.
    """
    try:
        import scipy.stats  # noqa: F401
    except (
        ImportError,
        ValueError,
        AttributeError,
        RuntimeError,
    ):  # a missing scipy, or one built for another numpy
        from diffusers.utils import import_utils

        import_utils._scipy_available = False


class Schedulers:
    """Fresh diffusers schedulers (they are stateful) by name, from the checkpoint's config.

    Args:
        config_path: the checkpoint's ``scheduler/scheduler_config.json``.
        classes: request name -> diffusers class name; "" is the checkpoint's own class.

    Raises:
        ValueError: a class diffusers does not have, or one that cannot take the config.
    """

    def __init__(self, config_path: str, classes: Mapping[str, str]) -> None:
        _usable_scipy()
        import diffusers

        with open(config_path, encoding="utf-8") as handle:
            raw = json.load(handle)
        names = {"": raw.get("_class_name", ""), **classes}
        self.classes = {}
        for name, class_name in names.items():
            cls = getattr(diffusers, class_name, None)
            if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
                raise ValueError(
                    f"scheduler {name or 'default'}: diffusers has no scheduler class {class_name!r}"
                )
            self.classes[name] = cls
        own = self.classes[""].from_config(raw)
        self.config = (
            own.config
        )  # the checkpoint's config with its class's defaults, as pipe.scheduler.config
        for name in self.classes:
            self.new(name).set_timesteps(2)  # fail at load time, not on a request

    def new(self, name: str) -> Any:
        return self.classes[name].from_config(self.config)


@dataclass(frozen=True)
class PipelineParts:
    """What the loop generates with: an entry's networks, tokenizer, schedulers and latent space.

    Attributes:
        networks: where the text encoder, UNet and VAE run.
        tokenizer: the checkpoint's CLIP tokenizer.
        schedulers: fresh schedulers by request name.
        latent_channels: the UNet's input channels.
        vae_scale_factor: an image side over its latent side.
        scaling_factor: the VAE's latent scaling (latents are divided by it before decoding).
        guidance_off: the UNet takes a guidance embedding instead (``time_cond_proj_dim``).
    """

    networks: Networks
    tokenizer: Any
    schedulers: Schedulers
    latent_channels: int
    vae_scale_factor: int
    scaling_factor: float
    guidance_off: bool = False


@dataclass
class Lane:
    """Rows that share a scheduler, a step count and a guidance scale."""

    keys: list[Hashable]
    requests: list[Request]
    scheduler: Any
    guidance: float
    guided: bool
    generators: list[torch.Generator]
    latents: torch.Tensor | None = None
    context: torch.Tensor | None = None  # [negative prompts; prompts] when guided, else prompts
    extra: dict[str, Any] = field(default_factory=dict)
    position: int = 0

    @property
    def timesteps(self) -> torch.Tensor:
        return self.scheduler.timesteps  # type: ignore[no-any-return]

    @property
    def finished(self) -> bool:
        return self.position >= len(self.timesteps)


def lanes_of(
    rows: Sequence[tuple[Hashable, Request]], schedulers: Schedulers, *, guidance_off: bool = False
) -> list[Lane]:
    """Rows grouped by (scheduler, steps, guidance), in order of first appearance."""
    grouped: dict[tuple[str, int, float], list[tuple[Hashable, Request]]] = {}
    for key, request in rows:
        grouped.setdefault((request.scheduler, request.steps, request.guidance), []).append(
            (key, request)
        )
    lanes = []
    for (name, _, guidance), members in grouped.items():
        lanes.append(
            Lane(
                keys=[k for k, _ in members],
                requests=[r for _, r in members],
                scheduler=schedulers.new(name),
                guidance=guidance,
                guided=guidance > 1.0 and not guidance_off,
                generators=[torch.Generator("cpu").manual_seed(r.seed) for _, r in members],
            )
        )
    return lanes


def _embed(networks: Networks, tokenizer: Any, texts: list[str]) -> torch.Tensor:
    ids = tokenizer(
        texts,
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids
    return networks.encode(ids.to(networks.device)).to(dtype=networks.dtype, device=networks.device)


def _step_kwargs(scheduler: Any, generators: list[torch.Generator]) -> dict[str, Any]:
    accepted = set(inspect.signature(scheduler.step).parameters)
    extra: dict[str, Any] = {}
    if "eta" in accepted:
        extra["eta"] = 0.0
    if "generator" in accepted:
        extra["generator"] = generators if len(generators) > 1 else generators[0]
    return extra


def _postprocess(decoded: torch.Tensor) -> torch.Tensor:
    # VaeImageProcessor.postprocess(output_type="np") in the decoder's dtype, then 0-255 as a
    # client rounds it: (image * 255).round() in float32.
    image = (decoded * 0.5 + 0.5).clamp(0, 1).float()
    return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu()


def generate(
    rows: Sequence[tuple[Hashable, Request]],
    parts: PipelineParts,
    done: Done,
    timings: dict[str, float] | None = None,
) -> None:
    """Generate every row (all of one HEIGHT x WIDTH) in one loop; ``done`` hears of each lane as it ends.

    Args:
        rows: (key, request) pairs; the key comes back to ``done`` with the row's image.
        parts: the entry's networks, tokenizer, schedulers and latent space.
        timings: filled with seconds spent in ``prepare`` (prompts, noise), ``denoise`` and ``decode``
            (VAE, post-processing, answers) and the number of ``unet_calls`` (waits for the device
            at each phase's end, so the split is true on a GPU).

    Raises:
        ValueError: rows of different sizes.
    """
    from diffusers.utils.torch_utils import randn_tensor

    sizes = {(r.height, r.width) for _, r in rows}
    if len(sizes) != 1:
        raise ValueError(f"one loop runs one image size, got {sorted(sizes)}")
    height, width = sizes.pop()
    networks, tokenizer = parts.networks, parts.tokenizer
    lanes = lanes_of(rows, parts.schedulers, guidance_off=parts.guidance_off)
    clock = _Clock(networks.device, timings)
    with torch.inference_mode():
        for lane in lanes:
            prompts = _embed(networks, tokenizer, [r.prompt for r in lane.requests])
            if lane.guided:
                negatives = _embed(networks, tokenizer, [r.negative_prompt for r in lane.requests])
                lane.context = torch.cat([negatives, prompts])
            else:
                lane.context = prompts
            lane.scheduler.set_timesteps(lane.requests[0].steps, device=networks.device)
            shape = (
                len(lane.requests),
                parts.latent_channels,
                height // parts.vae_scale_factor,
                width // parts.vae_scale_factor,
            )
            noise = randn_tensor(
                shape, generator=lane.generators, device=networks.device, dtype=prompts.dtype
            )
            lane.latents = noise * lane.scheduler.init_noise_sigma
            lane.extra = _step_kwargs(lane.scheduler, lane.generators)
        clock.lap("prepare")
        active = lanes
        while active:
            _step(active, networks)
            clock.count("unet_calls")
            ended = [lane for lane in active if lane.finished]
            if ended:
                clock.lap("denoise")
                latents = torch.cat([lane.latents for lane in ended])  # type: ignore[misc]
                images = _postprocess(networks.decode(latents / parts.scaling_factor))
                start = 0
                for lane in ended:
                    done(lane.keys, images[start : start + len(lane.keys)])
                    start += len(lane.keys)
                clock.lap("decode")
            active = [lane for lane in active if not lane.finished]


class _Clock:
    """Seconds per phase into ``timings`` (nothing when it is None)."""

    def __init__(self, device: torch.device, timings: dict[str, float] | None) -> None:
        self.device, self.timings = device, timings
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.timings is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
        self.last = now

    def count(self, name: str) -> None:
        if self.timings is not None:
            self.timings[name] = self.timings.get(name, 0) + 1


def _step(lanes: list[Lane], networks: Networks) -> None:
    """One denoising step of every lane, through one UNet call."""
    samples, contexts, times, sizes = [], [], [], []
    for lane in lanes:
        assert lane.latents is not None and lane.context is not None
        t = lane.timesteps[lane.position]
        sample = torch.cat([lane.latents] * 2) if lane.guided else lane.latents
        samples.append(lane.scheduler.scale_model_input(sample, t))
        contexts.append(lane.context)
        sizes.append(sample.shape[0])
        # The UNet embeds the timestep in float32 (get_timestep_embedding), so int and float
        # timesteps of different schedulers share one vector without changing any row.
        times.append(
            t.reshape(1).to(device=networks.device, dtype=torch.float32).expand(sample.shape[0])
        )
    if len(lanes) == 1:
        noise_all = networks.unet(samples[0], times[0], contexts[0])
    else:
        noise_all = networks.unet(torch.cat(samples), torch.cat(times), torch.cat(contexts))
    for lane, noise in zip(lanes, noise_all.split(sizes), strict=True):
        if lane.guided:
            uncond, cond = noise.chunk(2)
            noise = uncond + lane.guidance * (cond - uncond)
        t = lane.timesteps[lane.position]
        lane.latents = lane.scheduler.step(noise, t, lane.latents, **lane.extra, return_dict=False)[
            0
        ]
        lane.position += 1
