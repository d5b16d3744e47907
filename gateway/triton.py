"""Talking to Triton: a small interface and its real implementation on ``tritonclient.http.aio``.

The service layer only sees :class:`InferenceBackend`; tests of the service can hand it a fake,
integration tests always use :class:`TritonHttpBackend` against a real server.

Every tritonclient / aiohttp / timeout error is translated here into :mod:`gateway.errors`
(``raise ... from exc``), so nothing above this module knows which client library is used:

- connection refused / reset / DNS -> :class:`UpstreamUnavailable` (503, fast: no retry loop)
- the per-request deadline passed -> :class:`UpstreamTimeout` (504)
- "unknown model" / "no available versions" -> :class:`ModelNotFound` (404)
- any other 4xx from Triton -> :class:`InferenceInputError` (400, Triton's message, the input named)
- 5xx from Triton -> :class:`UpstreamError` (502), or :class:`ModelNotReady` when it says so

The KServe passthrough forwards request bytes untouched (JSON or the binary tensor extension);
tritonclient has no public call for an already-encoded body, so that one path uses an aiohttp
session of its own (aiohttp is what tritonclient's aio client runs on). Both are connection pools.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
import numpy as np
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from gateway.errors import (
    GatewayError,
    InferenceInputError,
    ModelNotFound,
    ModelNotReady,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = ["InferenceBackend", "RawResponse", "Tensor", "TritonHttpBackend", "translate_error"]

_PASSTHROUGH_HEADERS = ("content-type", "inference-header-content-length", "content-encoding")
_INPUT_NAME = re.compile(r"input '([^']+)'")


@dataclass(frozen=True)
class Tensor:
    """A named input tensor; the Triton datatype follows the array's dtype (object -> BYTES)."""

    name: str
    data: np.ndarray


@dataclass(frozen=True)
class RawResponse:
    """Triton's answer to a passthrough request: body bytes plus the headers that describe them."""

    body: bytes
    headers: dict[str, str]


class InferenceBackend(Protocol):
    """What the service layer needs from an inference server."""

    async def infer(
        self,
        model: str,
        inputs: Sequence[Tensor],
        outputs: Sequence[str] | None = None,
        *,
        timeout_s: float,
        version: str = "",
    ) -> dict[str, np.ndarray]: ...

    async def infer_raw(
        self, model: str, body: bytes, headers: Mapping[str, str], *, timeout_s: float, version: str = ""
    ) -> RawResponse: ...

    async def model_metadata(self, model: str, *, timeout_s: float) -> dict[str, Any]: ...

    async def model_ready(self, model: str, *, timeout_s: float) -> bool: ...

    async def server_ready(self, *, timeout_s: float) -> bool: ...

    async def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]: ...

    async def statistics(self, *, timeout_s: float) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...


def _model_missing(message: str) -> bool:
    text = message.lower()
    return "unknown model" in text or "no available versions" in text


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
        return UpstreamTimeout(f"Triton did not answer{f' for model {model!r}' if model else ''} in time")
    if isinstance(exc, aiohttp.ClientConnectionError | ConnectionError | OSError):
        return UpstreamUnavailable(f"Triton is unreachable ({type(exc).__name__})", retry_after_s=1)
    if isinstance(exc, InferenceServerException):
        return _from_status(exc.status(), exc.message() or str(exc), model)
    return UpstreamError(f"unexpected error talking to Triton: {type(exc).__name__}")


def _request_unparseable(message: str) -> bool:
    # Triton's HTTP front end answers a body it cannot parse (bad JSON, a wrong field type) with a
    # 500, though the fault is the client's: "failed to parse the request JSON buffer: ...",
    # "Unable to parse 'inputs': ...", "failed to get request params.: ...".
    return message.lower().startswith(("failed to parse", "unable to parse", "failed to get request params"))


def _from_status(status: str | int | None, message: str, model: str | None) -> GatewayError:
    code = int(status) if status and str(status).isdigit() else 0
    if _model_missing(message) and model:
        return ModelNotFound(model, f"model '{model}' is not served by Triton: {message}")
    if code == 503 or "not ready" in message.lower():
        return ModelNotReady(f"model '{model}' is not ready: {message}", retry_after_s=1)
    if 400 <= code < 500 or _request_unparseable(message):
        match = _INPUT_NAME.search(message)
        return InferenceInputError(message, field=f"inputs.{match.group(1)}" if match else None)
    return UpstreamError(f"Triton failed{f' on model {model!r}' if model else ''}: {message}")


def _triton_dtype(array: np.ndarray) -> str:
    return (
        "BYTES" if array.dtype == np.object_ or array.dtype.kind in "SU" else np_to_triton_dtype(array.dtype)
    )


class TritonHttpBackend:
    """The real backend: Triton over HTTP with pooled aio connections.

    Args:
        url: ``host:port`` of Triton's HTTP endpoint.
        pool_size: most concurrent connections to Triton.
    """

    def __init__(self, url: str, pool_size: int = 64) -> None:
        self.url = url
        self._client = triton_aio.InferenceServerClient(url, conn_limit=pool_size)
        self._raw = aiohttp.ClientSession(
            base_url=f"http://{url}",
            connector=aiohttp.TCPConnector(limit=pool_size),
            auto_decompress=False,
        )

    async def infer(
        self,
        model: str,
        inputs: Sequence[Tensor],
        outputs: Sequence[str] | None = None,
        *,
        timeout_s: float,
        version: str = "",
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` (binary tensors both ways).

        Args:
            model: the Triton model name.
            inputs: named arrays; shapes must include the batch axis where the model batches.
            outputs: names to return; every output when ``None``.
            timeout_s: the whole call's deadline.
            version: the model version to run ('' lets Triton's version policy choose).

        Returns:
            Output name -> array.

        Raises:
            GatewayError: translated as the module docstring says.
        """
        infer_inputs = []
        for tensor in inputs:
            item = triton_aio.InferInput(tensor.name, list(tensor.data.shape), _triton_dtype(tensor.data))
            item.set_data_from_numpy(tensor.data, binary_data=True)
            infer_inputs.append(item)
        requested = (
            [triton_aio.InferRequestedOutput(n, binary_data=True) for n in outputs] if outputs else None
        )
        try:
            async with asyncio.timeout(timeout_s):
                result = await self._client.infer(model, infer_inputs, model_version=version, outputs=requested)
        except Exception as exc:
            raise translate_error(exc, model) from exc
        response = result.get_response()
        return {o["name"]: result.as_numpy(o["name"]) for o in response.get("outputs", [])}

    async def infer_raw(
        self, model: str, body: bytes, headers: Mapping[str, str], *, timeout_s: float, version: str = ""
    ) -> RawResponse:
        """Forward an encoded KServe v2 request body to ``model`` and return Triton's answer as is.

        Raises:
            GatewayError: translated as the module docstring says.
        """
        forward = {k: v for k, v in headers.items() if k.lower() in _PASSTHROUGH_HEADERS}
        # aiohttp would ask for gzip on its own; let Triton compress only when the client asked.
        forward["Accept-Encoding"] = next(
            (v for k, v in headers.items() if k.lower() == "accept-encoding"), "identity"
        )
        try:
            async with asyncio.timeout(timeout_s):
                async with self._raw.post(
                    _infer_path(model, version), data=body, headers=forward
                ) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        raise _from_status(resp.status, _error_message(payload), model)
                    out = {k: v for k, v in resp.headers.items() if k.lower() in _PASSTHROUGH_HEADERS}
        except GatewayError:
            raise
        except Exception as exc:
            raise translate_error(exc, model) from exc
        return RawResponse(payload, out)

    async def model_metadata(self, model: str, *, timeout_s: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout_s):
                return dict(await self._client.get_model_metadata(model))
        except Exception as exc:
            raise translate_error(exc, model) from exc

    async def model_ready(self, model: str, *, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self._client.is_model_ready(model))
        except Exception as exc:
            raise translate_error(exc, model) from exc

    async def server_ready(self, *, timeout_s: float) -> bool:
        """Whether Triton says it is ready; ``False`` (never an error) when it cannot be reached."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self._client.is_server_ready())
        except Exception:  # a probe: unreachable, slow or broken all mean "not ready"
            return False

    async def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        try:
            async with asyncio.timeout(timeout_s):
                return list(await self._client.get_model_repository_index())
        except Exception as exc:
            raise translate_error(exc) from exc

    async def statistics(self, *, timeout_s: float) -> list[dict[str, Any]]:
        """Triton's statistics extension for every loaded model (cumulative counters)."""
        try:
            async with asyncio.timeout(timeout_s):
                stats = await self._client.get_inference_statistics()
        except Exception as exc:
            raise translate_error(exc) from exc
        return list(stats.get("model_stats", []))

    async def close(self) -> None:
        await self._client.close()
        await self._raw.close()


def _infer_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}/infer" if version else f"{path}/infer"


def _error_message(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("error", "")) or payload.decode(errors="replace")[:500]
    except (ValueError, AttributeError):
        return payload.decode(errors="replace")[:500]
