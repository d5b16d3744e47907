"""Triton's errors in the gateway's words: every tritonclient / aiohttp / timeout error becomes one
of :mod:`gateway.errors` (see :mod:`gateway.backends.triton` for the table), and a client sees only
:func:`safe_message` of what Triton said.

Both transports use it (:mod:`gateway.backends.triton`, :mod:`gateway.backends.triton_grpc`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

import aiohttp
from tritonclient.utils import InferenceServerException

from gateway.errors import (
    GatewayError,
    InferenceInputError,
    ModelNotFound,
    ModelNotReady,
    ModelUnhealthy,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = ["error_message", "from_status", "safe_message", "translate_error"]

# The logger these lines always went to: operators filter on it.
log = logging.getLogger("gateway.backends.triton")

_INPUT_NAME = re.compile(r"input '([^']+)'")
_MAX_MESSAGE_CHARS = 400
# The Python backend's answer once a stub process is gone; instances are named <model>_<group>_<index>.
_STUB_UNHEALTHY = re.compile(r"Stub process '(?P<model>[^']+?)_\d+_\d+' is not healthy")
# What a Triton or Python-backend message may carry that a client must not see.
_REQUEST_ID = re.compile(r"^\s*\[request id: [^\]]*\]\s*")
_TRACEBACK = re.compile(r"(\n\s*At:\s*\n|Traceback \(most recent call last\)).*", re.DOTALL)
_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
# Two or more segments, not glued to a word ("JPEG/PNG" is text, "/opt/x/model.py" a path).
_PATH = re.compile(r"(?<![\w/\\])(?:[A-Za-z]:)?(?:[\\/](?=[\w.@+~-]*\w)[\w.@+~-]+){2,}[\\/]?")


def _model_missing(message: str) -> bool:
    text = message.lower()
    return "unknown model" in text or "no available versions" in text


def safe_message(message: str) -> str:
    """Triton's message cut to what a client may read: its first line, without the request id,
    a Python traceback, file paths, object reprs or memory addresses, at most 400 characters."""
    text = _TRACEBACK.sub("", _REQUEST_ID.sub("", message))
    text = _PATH.sub("<path>", _ADDRESS.sub("<address>", _OBJECT_REPR.sub("<object>", text)))
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."


def translate_error(exc: BaseException, model: str | None = None) -> GatewayError:
    """Map a client-library exception to the gateway's hierarchy.

    Args:
        exc: what tritonclient, aiohttp or asyncio raised.
        model: the model being called, for messages.

    Returns:
        The :class:`GatewayError` to raise (``from exc``).
    """
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(
            f"Triton did not answer{f' for model {model!r}' if model else ''} in time"
        )
    if isinstance(exc, aiohttp.ClientConnectionError | ConnectionError | OSError):
        log.warning("Triton is unreachable: %r", exc)
        return UpstreamUnavailable("Triton is unreachable", retry_after_s=1)
    if isinstance(exc, InferenceServerException):
        return from_status(exc.status(), exc.message() or str(exc), model)
    log.error(
        "unexpected error talking to Triton%s: %r", f" (model {model!r})" if model else "", exc
    )
    return UpstreamError("unexpected error talking to Triton; it is in the gateway's log")


def _request_unparseable(message: str) -> bool:
    # Triton's HTTP front end answers a body it cannot parse (bad JSON, a wrong field type) with a
    # 500, though the fault is the client's: "failed to parse the request JSON buffer: ...",
    # "Unable to parse 'inputs': ...", "failed to get request params.: ...".
    return message.lower().startswith(
        ("failed to parse", "unable to parse", "failed to get request params")
    )


def from_status(status: str | int | None, message: str, model: str | None) -> GatewayError:
    """Map Triton's status code and message for ``model`` to the gateway's hierarchy."""
    code = int(status) if status and str(status).isdigit() else 0
    client_fault = 400 <= code < 500 or _request_unparseable(message)
    # The full message stays in the log (it names files and libraries, which is what an operator needs).
    log.log(
        logging.INFO if client_fault else logging.WARNING,
        "Triton answered %s for model %r: %s",
        status,
        model,
        message,
    )
    safe = safe_message(message)
    if _model_missing(message) and model:
        return ModelNotFound(model, f"model '{model}' is not served by Triton ({safe})")
    # The queue policy's answers (both UNAVAILABLE in Triton): the deadline passed while queued,
    # or the bounded queue is full. Neither is the model being down.
    if "request timeout expired" in message.lower():
        return UpstreamTimeout(
            "the deadline passed while the request waited in Triton's "
            f"queue{f' for {model!r}' if model else ''}"
        )
    if "exceeds maximum queue size" in message.lower():
        return Overloaded(
            f"Triton's queue{f' for model {model!r}' if model else ''} is full; retry shortly",
            retry_after_s=1,
        )
    stub = _STUB_UNHEALTHY.search(message)
    if stub:
        return ModelUnhealthy(
            f"model '{model}' lost a worker process; it is being reloaded, retry shortly",
            failed_model=stub.group("model"),
            retry_after_s=1,
        )
    if code == 503 or "not ready" in message.lower():
        return ModelNotReady(f"model '{model}' is not ready", retry_after_s=1)
    if client_fault:
        match = _INPUT_NAME.search(safe)
        return InferenceInputError(safe, field=f"inputs.{match.group(1)}" if match else None)
    return UpstreamError(
        f"model '{model}' failed while running this request; the error is in the gateway's log "
        "(quote the X-Request-ID header)"
        if model
        else "Triton failed; the error is in the gateway's log"
    )


def error_message(payload: bytes) -> str:
    """The message of an error body Triton answered (its JSON ``error``, else the text)."""
    try:
        return str(json.loads(payload).get("error", "")) or payload.decode(errors="replace")[:500]
    except (ValueError, AttributeError):
        return payload.decode(errors="replace")[:500]
