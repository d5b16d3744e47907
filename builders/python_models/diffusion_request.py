"""Generation requests of the Stable Diffusion pipeline model: its limits and one Request per row.

Shared by the pipeline model (which checks what reaches Triton directly) and the builders (which
write the limits into the model's config from ``serving.limits``, the one place they are set). No
Triton import here, so both can use it.

A Triton request carries ``n`` rows (``[n, 1]`` per input, ``max_batch_size`` > 0): each row is one
image. Optional inputs take their defaults; every row of one request must share HEIGHT and WIDTH,
because its images return as one ``IMAGE`` tensor ``[n, HEIGHT, WIDTH, 3]``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

__all__ = ["INPUTS", "GenerationLimits", "InvalidRequest", "Request", "parse_rows"]

#: the pipeline's inputs; only PROMPT is required
INPUTS = ("PROMPT", "NEGATIVE_PROMPT", "STEPS", "GUIDANCE", "HEIGHT", "WIDTH", "SEED", "SCHEDULER")


class InvalidRequest(ValueError):
    """A request field is missing, malformed or out of range; the message starts with its name."""


@dataclass(frozen=True, kw_only=True)
class GenerationLimits:
    """What the pipeline model accepts (written into its config as ``limit_<field>`` parameters)."""

    min_steps: int = 1
    max_steps: int = 100
    default_steps: int = 25
    min_side: int = 64
    max_side: int = 1024
    side_multiple: int = 8
    default_side: int = 512
    max_seed: int = 2**63 - 1
    min_guidance: float = 0.0
    max_guidance: float = 30.0
    default_guidance: float = 7.5
    max_prompt_bytes: int = 4096
    #: scheduler names a request may give besides "default" (the checkpoint's own)
    schedulers: tuple[str, ...] = ()

    def parameters(self) -> dict[str, str]:
        return {
            f"limit_{k}": ",".join(v) if isinstance(v, tuple) else str(v)
            for k, v in asdict(self).items()
        }

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> GenerationLimits:
        values: dict[str, Any] = {}
        for item in fields(cls):
            raw = parameters.get(f"limit_{item.name}")
            if raw is None:
                continue
            if item.name == "schedulers":
                values[item.name] = tuple(s for s in raw.split(",") if s)
            else:
                values[item.name] = float(raw) if "guidance" in item.name else int(raw)
        return cls(**values)


@dataclass(frozen=True)
class Request:
    """One image to generate, with every default filled in."""

    prompt: str
    negative_prompt: str = ""
    steps: int = 25
    guidance: float = 7.5
    height: int = 512
    width: int = 512
    seed: int = 0
    #: a name of ``GenerationLimits.schedulers``, or "" for the checkpoint's own scheduler
    scheduler: str = ""


def _text(raw: Any, field: str, max_bytes: int) -> str:
    value = bytes(raw) if isinstance(raw, bytes | bytearray | np.bytes_) else str(raw).encode()
    if len(value) > max_bytes:
        raise InvalidRequest(f"{field} is {len(value)} bytes; at most {max_bytes} are accepted")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{field} is not valid UTF-8") from exc


def _row(values: Mapping[str, Any], limits: GenerationLimits) -> Request:
    steps = limits.default_steps if values["STEPS"] is None else int(values["STEPS"])
    if not limits.min_steps <= steps <= limits.max_steps:
        raise InvalidRequest(
            f"STEPS must be between {limits.min_steps} and {limits.max_steps}, got {steps}"
        )
    guidance = limits.default_guidance if values["GUIDANCE"] is None else float(values["GUIDANCE"])
    if not (np.isfinite(guidance) and limits.min_guidance <= guidance <= limits.max_guidance):
        raise InvalidRequest(
            f"GUIDANCE must be between {limits.min_guidance:g} and {limits.max_guidance:g}, got {guidance}"
        )
    sides = {}
    for name in ("HEIGHT", "WIDTH"):
        side = limits.default_side if values[name] is None else int(values[name])
        if side % limits.side_multiple or not limits.min_side <= side <= limits.max_side:
            raise InvalidRequest(
                f"{name} must be a multiple of {limits.side_multiple} between {limits.min_side} and "
                f"{limits.max_side}, got {side}"
            )
        sides[name] = side
    seed = secrets.randbelow(limits.max_seed + 1) if values["SEED"] is None else int(values["SEED"])
    if not 0 <= seed <= limits.max_seed:
        raise InvalidRequest(f"SEED must be between 0 and {limits.max_seed}, got {seed}")
    scheduler = "" if values["SCHEDULER"] is None else _text(values["SCHEDULER"], "SCHEDULER", 64)
    if scheduler == "default":
        scheduler = ""
    if scheduler and scheduler not in limits.schedulers:
        raise InvalidRequest(
            f"SCHEDULER must be one of default, {', '.join(limits.schedulers)}; got {scheduler!r}"
        )
    negative = values["NEGATIVE_PROMPT"]
    return Request(
        prompt=_text(values["PROMPT"], "PROMPT", limits.max_prompt_bytes),
        negative_prompt=""
        if negative is None
        else _text(negative, "NEGATIVE_PROMPT", limits.max_prompt_bytes),
        steps=steps,
        guidance=guidance,
        height=sides["HEIGHT"],
        width=sides["WIDTH"],
        seed=seed,
        scheduler=scheduler,
    )


def parse_rows(arrays: Mapping[str, np.ndarray | None], limits: GenerationLimits) -> list[Request]:
    """The images one Triton request asks for, one :class:`Request` per row.

    Args:
        arrays: input name -> array ``[rows, 1]`` (``None`` for an optional input not sent).

    Raises:
        InvalidRequest: the message names the input and, for a request of several rows, the row.
    """
    prompt = arrays.get("PROMPT")
    if prompt is None:
        raise InvalidRequest("PROMPT is required")
    rows = int(prompt.shape[0]) if prompt.ndim else 1
    columns: dict[str, np.ndarray | None] = {}
    for name in INPUTS:
        array = arrays.get(name)
        if array is not None:
            array = array.reshape(rows, -1) if array.size == rows else None
            if array is None:
                raise InvalidRequest(f"{name} must hold exactly one value per row ({rows} rows)")
        columns[name] = array
    requests = []
    for row in range(rows):
        values = {
            name: None if column is None else column[row, 0] for name, column in columns.items()
        }
        try:
            requests.append(_row(values, limits))
        except InvalidRequest as exc:
            raise InvalidRequest(f"{exc} (row {row})" if rows > 1 else str(exc)) from None
    if len({(r.height, r.width) for r in requests}) > 1:
        raise InvalidRequest(
            "HEIGHT and WIDTH must be the same in every row of one request (its images form one "
            "IMAGE tensor); send different sizes as separate requests"
        )
    return requests
