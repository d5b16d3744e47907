"""Every request limit of the platform, in one place.

The gateway enforces these (a 4xx naming the field, and the numbers stated in its OpenAPI schema),
the builders write them into the generated model configs (``parameters`` and the dynamic batcher's
queue policies), and the Python models check them again on what reaches Triton directly. A limit
changes here and nowhere else; a test compares what the gateway enforces with what the built
configs carry.

Limits are build-time constants, not runtime settings: the model configs carry them, so changing
one means rebuilding the repository, and a gateway that allowed more than its models would only
turn a clean 4xx into a model error.

::

    RequestLimits                 DEFAULT_LIMITS
    ├── embeddings                EmbeddingLimits: inputs per request, encoder batch, text length
    ├── image_generation          ImageGenerationLimits: steps, sides, seed, guidance, prompt
    ├── image_upload              ImageUploadLimits: what the gateway checks cheaply (count, bytes)
    ├── image_decode              DecodeLimits (serving.image_preprocessing, the model's own
    │                             type): what the preprocessing model checks before allocating
    ├── jobs                      JobLimits: generation jobs a key may hold, callback URL length
    └── queue                     QueueLimits: priority levels and per-level queue policies (Triton)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# The one decode-limits type: the preprocessing model's own (its file is copied beside the model, so
# the type lives there and this module fills in the platform's values).
from serving.image_preprocessing import DecodeLimits

__all__ = [
    "DEFAULT_EMBEDDING_BATCHES_IN_FLIGHT",
    "DEFAULT_EMBEDDING_BATCH_SIZE",
    "DEFAULT_EMBEDDING_MAX_INPUTS",
    "DEFAULT_EMBEDDING_MAX_TEXT_BYTES",
    "DEFAULT_EMBEDDING_MAX_TEXT_CHARS",
    "DEFAULT_EMBEDDING_MAX_TOKEN_IDS",
    "DEFAULT_GENERATION_DEFAULT_GUIDANCE",
    "DEFAULT_GENERATION_DEFAULT_SIDE",
    "DEFAULT_GENERATION_DEFAULT_STEPS",
    "DEFAULT_GENERATION_MAX_GUIDANCE",
    "DEFAULT_GENERATION_MAX_IMAGES",
    "DEFAULT_GENERATION_MAX_PROMPT_BYTES",
    "DEFAULT_GENERATION_MAX_PROMPT_CHARS",
    "DEFAULT_GENERATION_MAX_SEED",
    "DEFAULT_GENERATION_MAX_SIDE",
    "DEFAULT_GENERATION_MAX_STEPS",
    "DEFAULT_GENERATION_PIPELINE_BATCH",
    "DEFAULT_GENERATION_SCHEDULERS",
    "DEFAULT_GENERATION_MIN_SIDE",
    "DEFAULT_GENERATION_SIDE_MULTIPLE",
    "DEFAULT_IMAGE_MAX_ASPECT_RATIO",
    "DEFAULT_IMAGE_MAX_BYTES",
    "DEFAULT_IMAGE_MAX_COUNT",
    "DEFAULT_IMAGE_MAX_RESIZED_PIXELS",
    "DEFAULT_IMAGE_MAX_SOURCE_PIXELS",
    "DEFAULT_JOB_MAX_ACTIVE_PER_KEY",
    "DEFAULT_JOB_MAX_CALLBACK_URL_CHARS",
    "DEFAULT_JOB_MAX_KEPT_PER_KEY",
    "DEFAULT_LIMITS",
    "DEFAULT_PRIORITY_LEVEL",
    "DEFAULT_PRIORITY_LEVELS",
    "DEFAULT_QUEUE_MAX_SIZES",
    "DEFAULT_QUEUE_TIMEOUT_US",
    "EmbeddingLimits",
    "ImageGenerationLimits",
    "ImageUploadLimits",
    "JobLimits",
    "QueueLimits",
    "QueuePolicy",
    "RequestLimits",
]

# -- /v1/embeddings and the text_embedding ensemble ------------------------------------------------
#: inputs (strings or token arrays) one request may carry: OpenAI's own limit (LangChain sends chunks of
#: 1,000). The gateway splits them into the model's ``max_batch_size``, read from its config.
DEFAULT_EMBEDDING_MAX_INPUTS = 2048
#: the text encoder's ``max_batch_size`` (tokenizer, encoder, pooling and the ensemble share it); the
#: gateway uses it only for an entry whose config declares none
DEFAULT_EMBEDDING_BATCH_SIZE = 32
#: encoder batches of one request in Triton at once: 2,048 inputs are 64 batches, as many as the
#: lowest priority level queues (DEFAULT_QUEUE_MAX_SIZES), so one request must not send them all at once
DEFAULT_EMBEDDING_BATCHES_IN_FLIGHT = 8
#: characters per string. The tokenizer truncates at 256 tokens (about 1,000-1,500 characters of
#: English), but it reads the whole string first: this bounds that work and its memory.
DEFAULT_EMBEDDING_MAX_TEXT_CHARS = 8192
#: UTF-8 bytes per string (what a model sees); 4 bytes per character at most
DEFAULT_EMBEDDING_MAX_TEXT_BYTES = 4 * DEFAULT_EMBEDDING_MAX_TEXT_CHARS
#: token ids per input when ``input`` is token arrays (OpenAI's per-input limit); the tokenizer
#: keeps the first 254 of them plus [CLS] and [SEP]
DEFAULT_EMBEDDING_MAX_TOKEN_IDS = 8192

# -- /v1/images/generations and the stable_diffusion pipeline ---------------------------------------
DEFAULT_GENERATION_DEFAULT_STEPS = 25
#: images per request (``n``): each is one pipeline run, so this bounds one request's work
DEFAULT_GENERATION_MAX_IMAGES = 4
DEFAULT_GENERATION_MAX_STEPS = 100
DEFAULT_GENERATION_MIN_SIDE = 64
#: a 1024x1024 SD 1.x image already takes about 16 GB of UNet activations on CPU
DEFAULT_GENERATION_MAX_SIDE = 1024
#: the VAE's downsampling factor: latents are side / 8
DEFAULT_GENERATION_SIDE_MULTIPLE = 8
DEFAULT_GENERATION_DEFAULT_SIDE = 512
#: seeds travel as INT64 and seed ``torch.Generator``, which takes any non-negative int64
DEFAULT_GENERATION_MAX_SEED = 2**63 - 1
DEFAULT_GENERATION_DEFAULT_GUIDANCE = 7.5
DEFAULT_GENERATION_MAX_GUIDANCE = 30.0
#: characters of a prompt (and of a negative prompt); CLIP reads 77 tokens of it anyway
DEFAULT_GENERATION_MAX_PROMPT_CHARS = 1000
#: UTF-8 bytes of a prompt as the pipeline model checks it; at least 4 per allowed character
DEFAULT_GENERATION_MAX_PROMPT_BYTES = 4096
#: the schedulers a request may name (``SCHEDULER`` / ``scheduler``), each a diffusers class built from
#: the checkpoint's own scheduler config; ``default`` (or nothing) is the checkpoint's own scheduler
DEFAULT_GENERATION_SCHEDULERS: Mapping[str, str] = MappingProxyType(
    {
        "pndm": "PNDMScheduler",
        "ddim": "DDIMScheduler",
        "euler": "EulerDiscreteScheduler",
        "euler_ancestral": "EulerAncestralDiscreteScheduler",
        "dpmpp_2m": "DPMSolverMultistepScheduler",
    }
)
#: generation requests the pipeline model runs in one denoising loop (its ``max_batch_size``): with
#: classifier-free guidance the UNet sees twice as many rows
DEFAULT_GENERATION_PIPELINE_BATCH = 8

# -- /v1/classify and the image_classifier ensemble -------------------------------------------------
#: images per request: the classifier ensemble's ``max_batch_size``
DEFAULT_IMAGE_MAX_COUNT = 8
#: encoded bytes per image (the body limit bounds the request as a whole)
DEFAULT_IMAGE_MAX_BYTES = 8 * 1024 * 1024
#: decoded pixels of a source image, checked from its header before decoding (24 MP cameras fit)
DEFAULT_IMAGE_MAX_SOURCE_PIXELS = 25_000_000
#: long side / short side of a source image: resizing the short side to 256 makes the long side
#: 256 x this, so it bounds the resize target too (an 8000x1 PNG would otherwise become 2 GB)
DEFAULT_IMAGE_MAX_ASPECT_RATIO = 20.0
#: pixels of the resize target, checked before ``resize`` allocates it
DEFAULT_IMAGE_MAX_RESIZED_PIXELS = 4_000_000

# -- /v1/images/jobs: generation as jobs --------------------------------------------------------------
#: jobs one key may have queued or running at once; past it a submission is a 429 (the queue is a
#: place to wait, not a way around the rate limit and the in-flight share)
DEFAULT_JOB_MAX_ACTIVE_PER_KEY = 8
#: jobs one key may hold in the store at once, finished ones included (their images are kept until
#: they expire or are deleted): this bounds what one key can make the store hold
DEFAULT_JOB_MAX_KEPT_PER_KEY = 32
#: characters of a callback URL
DEFAULT_JOB_MAX_CALLBACK_URL_CHARS = 2048

# -- Triton scheduling: priorities and queue policies ------------------------------------------------
#: request priority levels of every dynamic batcher (1 is served first); the gateway maps tiers to them
DEFAULT_PRIORITY_LEVELS = 3
#: the level of a request that names none (a client talking to Triton directly): the lowest
DEFAULT_PRIORITY_LEVEL = 3
#: per level, 1 first: requests a model may hold queued before Triton refuses more (UNAVAILABLE)
DEFAULT_QUEUE_MAX_SIZES: tuple[int, ...] = (256, 128, 64)
#: a queued request older than this is rejected, never run; a request's own ``timeout`` parameter
#: (the gateway's remaining deadline) may shorten it but not extend it
DEFAULT_QUEUE_TIMEOUT_US = 30_000_000


@dataclass(frozen=True, kw_only=True)
class EmbeddingLimits:
    """Limits of one embeddings request.

    Attributes:
        max_inputs: inputs (strings or token arrays) per request.
        batch_size: the encoder's ``max_batch_size`` where a model's config gives none; larger
            requests are split into chunks of the model's own ``max_batch_size``.
        batches_in_flight: chunks of one request sent to Triton at once.
        max_text_chars: characters per string.
        max_text_bytes: UTF-8 bytes per string.
        max_token_ids: ids per input when the input is token arrays.
    """

    max_inputs: int = DEFAULT_EMBEDDING_MAX_INPUTS
    batch_size: int = DEFAULT_EMBEDDING_BATCH_SIZE
    batches_in_flight: int = DEFAULT_EMBEDDING_BATCHES_IN_FLIGHT
    max_text_chars: int = DEFAULT_EMBEDDING_MAX_TEXT_CHARS
    max_text_bytes: int = DEFAULT_EMBEDDING_MAX_TEXT_BYTES
    max_token_ids: int = DEFAULT_EMBEDDING_MAX_TOKEN_IDS


@dataclass(frozen=True, kw_only=True)
class ImageGenerationLimits:
    """Limits of one image-generation request (one image, ``max_batch_size`` 0).

    Attributes:
        min_steps, max_steps, default_steps: denoising steps.
        min_side, max_side, side_multiple, default_side: width and height in pixels.
        min_seed, max_seed: the seed range (INT64, non-negative).
        min_guidance, max_guidance, default_guidance: classifier-free guidance scale.
        max_prompt_chars: characters of the prompt and of the negative prompt.
        max_prompt_bytes: UTF-8 bytes of either, as the pipeline model checks them.
        max_images: images per request (``n``), each one pipeline run.
        schedulers: scheduler names a request may ask for -> diffusers class name.
        pipeline_batch: requests the pipeline model runs in one denoising loop.
    """

    min_steps: int = 1
    max_steps: int = DEFAULT_GENERATION_MAX_STEPS
    default_steps: int = DEFAULT_GENERATION_DEFAULT_STEPS
    min_side: int = DEFAULT_GENERATION_MIN_SIDE
    max_side: int = DEFAULT_GENERATION_MAX_SIDE
    side_multiple: int = DEFAULT_GENERATION_SIDE_MULTIPLE
    default_side: int = DEFAULT_GENERATION_DEFAULT_SIDE
    min_seed: int = 0
    max_seed: int = DEFAULT_GENERATION_MAX_SEED
    min_guidance: float = 0.0
    max_guidance: float = DEFAULT_GENERATION_MAX_GUIDANCE
    default_guidance: float = DEFAULT_GENERATION_DEFAULT_GUIDANCE
    max_prompt_chars: int = DEFAULT_GENERATION_MAX_PROMPT_CHARS
    max_prompt_bytes: int = DEFAULT_GENERATION_MAX_PROMPT_BYTES
    max_images: int = DEFAULT_GENERATION_MAX_IMAGES
    # A copy per instance: a plain dict, so dataclasses.asdict (which deep-copies) can read it.
    schedulers: Mapping[str, str] = field(
        default_factory=lambda: dict(DEFAULT_GENERATION_SCHEDULERS)
    )
    pipeline_batch: int = DEFAULT_GENERATION_PIPELINE_BATCH

    def scheduler_problem(self, value: str) -> str | None:
        """Why ``value`` is not a scheduler a request may name (``None`` when it is; "" is the default)."""
        if value in ("", "default") or value in self.schedulers:
            return None
        return f"scheduler must be one of default, {', '.join(self.schedulers)}; got {value[:40]!r}"

    def side_problem(self, name: str, value: int) -> str | None:
        """Why ``value`` is not an acceptable width/height (``None`` when it is)."""
        if value % self.side_multiple or not self.min_side <= value <= self.max_side:
            return (
                f"{name} must be a multiple of {self.side_multiple} between {self.min_side} and "
                f"{self.max_side}, got {value}"
            )
        return None


@dataclass(frozen=True, kw_only=True)
class ImageUploadLimits:
    """What the gateway checks on uploaded images without decoding them.

    Attributes:
        max_count: images per request (the classifier ensemble's ``max_batch_size``).
        max_bytes: encoded bytes per image.
    """

    max_count: int = DEFAULT_IMAGE_MAX_COUNT
    max_bytes: int = DEFAULT_IMAGE_MAX_BYTES


@dataclass(frozen=True, kw_only=True)
class JobLimits:
    """What one API key may hold as generation jobs.

    Attributes:
        max_active_per_key: jobs queued or running at once.
        max_kept_per_key: jobs held at once, finished ones (with their images) included.
        max_callback_url_chars: characters of a job's ``callback_url``.
    """

    max_active_per_key: int = DEFAULT_JOB_MAX_ACTIVE_PER_KEY
    max_kept_per_key: int = DEFAULT_JOB_MAX_KEPT_PER_KEY
    max_callback_url_chars: int = DEFAULT_JOB_MAX_CALLBACK_URL_CHARS


@dataclass(frozen=True)
class QueuePolicy:
    """One priority level's queue policy (Triton's ``ModelQueuePolicy``, timeout action REJECT).

    Attributes:
        max_queue_size: requests queued at this level before new ones are refused.
        default_timeout_us: how long a request may wait queued before it is rejected.
        allow_timeout_override: whether a request's ``timeout`` parameter may shorten the wait.
    """

    max_queue_size: int
    default_timeout_us: int = DEFAULT_QUEUE_TIMEOUT_US
    allow_timeout_override: bool = True


def _default_levels() -> tuple[QueuePolicy, ...]:
    return tuple(QueuePolicy(size) for size in DEFAULT_QUEUE_MAX_SIZES)


@dataclass(frozen=True, kw_only=True)
class QueueLimits:
    """How Triton queues requests: priority levels and a bounded, rejecting queue per level.

    Attributes:
        priority_levels: levels of every dynamic batcher (1 = served first).
        default_priority_level: the level of a request without a ``priority`` parameter.
        levels: the queue policy of level ``i + 1`` at index ``i``.
        default_instances: instances the builders give a model with these queues unless its spec names
            a count: with one, Triton's batcher can sleep 500 ms before it hands a queued request
            to the instance that just finished (``builders.triton_config.model_config`` says why).
    """

    priority_levels: int = DEFAULT_PRIORITY_LEVELS
    default_priority_level: int = DEFAULT_PRIORITY_LEVEL
    levels: tuple[QueuePolicy, ...] = field(default_factory=_default_levels)
    default_instances: int = 2

    def __post_init__(self) -> None:
        if len(self.levels) != self.priority_levels:
            raise ValueError(
                f"{len(self.levels)} queue policies for {self.priority_levels} priority levels"
            )
        if not 1 <= self.default_priority_level <= self.priority_levels:
            raise ValueError(f"default_priority_level must be in 1..{self.priority_levels}")
        if self.default_instances < 1:
            raise ValueError("default_instances must be at least 1")

    def policy(self, level: int) -> QueuePolicy:
        """The queue policy of priority ``level`` (1-based)."""
        return self.levels[level - 1]


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """Every request limit, grouped by the API that carries it."""

    embeddings: EmbeddingLimits = field(default_factory=EmbeddingLimits)
    image_generation: ImageGenerationLimits = field(default_factory=ImageGenerationLimits)
    image_upload: ImageUploadLimits = field(default_factory=ImageUploadLimits)
    image_decode: DecodeLimits = field(
        default_factory=lambda: DecodeLimits(
            max_source_pixels=DEFAULT_IMAGE_MAX_SOURCE_PIXELS,
            max_aspect_ratio=DEFAULT_IMAGE_MAX_ASPECT_RATIO,
            max_resized_pixels=DEFAULT_IMAGE_MAX_RESIZED_PIXELS,
        )
    )
    jobs: JobLimits = field(default_factory=JobLimits)
    queue: QueueLimits = field(default_factory=QueueLimits)


#: the limits the builders write into configs and the gateway enforces
DEFAULT_LIMITS = RequestLimits()
