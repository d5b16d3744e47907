"""Talking to Triton: a small interface and its real implementation on ``tritonclient.http.aio``.

The service layer only sees :class:`InferenceBackend`; tests of the service can hand it a fake,
integration tests always use :class:`TritonHttpBackend` against a real server.

Every tritonclient, connection, pool and timeout error is translated into :mod:`gateway.errors` by
:mod:`gateway.backends.triton_errors` (``raise ... from exc``), so nothing above this module knows
which client library is used:

- connection refused / reset / DNS -> :class:`UpstreamUnavailable` (503, fast: no retry loop)
- the per-request deadline passed, here or in Triton's queue -> :class:`UpstreamTimeout` (504)
- the model's queue is full ("Exceeds maximum queue size") -> :class:`Overloaded` (429, Retry-After)
- "unknown model" / "no available versions" -> :class:`ModelNotFound` (404)
- any other 4xx from Triton -> :class:`InferenceInputError` (400, the input named)
- 5xx from Triton -> :class:`UpstreamError` (502), or :class:`ModelNotReady` when it says so
- "Stub process '<instance>' is not healthy" (a Python stub died) -> :class:`ModelUnhealthy` (503,
  naming the model of that instance, which may be a step of the pipeline called)

Triton's own words go to the log in full; a client sees only :func:`safe_message` of them (no
traceback, file path, memory address or request id; one line), or for a 5xx a message of ours,
since a model's crash says nothing the client can act on and may say much about the server.

Deadlines travel: every inference carries what is left of the gateway's deadline as Triton's
``timeout`` request parameter (microseconds) and the caller's tier as its ``priority``, so a request
the gateway stopped waiting for is rejected from Triton's queue (the model configs' queue policies
allow the override) instead of running for nobody.

KServe v2 requests arrive already checked (:class:`gateway.protocol.kserve.InferRequest`) and are sent as
:func:`gateway.protocol.kserve.encode_rest` encodes them, never as the client's bytes. tritonclient has no
public call for an already-encoded body, and that path is the hot one, so it goes over the gateway's
own keep-alive connections (:mod:`gateway.backends.http1_pool`, which says why not aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import numpy as np
import tritonclient.http.aio as triton_aio
from tritonclient.utils import np_to_triton_dtype

from gateway.backends.http1_pool import Http1Pool
from gateway.backends.triton_errors import error_message, from_status, safe_message, translate_error
from gateway.protocol.kserve import InferRequest, encode_rest

__all__ = [
    "RELOAD_PARAMETER",
    "InferenceBackend",
    "RawResponse",
    "Tensor",
    "TritonHttpBackend",
    "safe_message",
    "timeout_us",
    "reload_config",
    "translate_error",
]

T = TypeVar("T")

# Headers of Triton's answer that describe its body; passed back to the client with it.
_RESPONSE_HEADERS = ("content-type", "inference-header-content-length", "content-encoding")


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
        priority: int = 0,
    ) -> dict[str, np.ndarray]: ...

    async def infer_v2(
        self,
        model: str,
        request: InferRequest,
        *,
        timeout_s: float,
        version: str = "",
        accept_encoding: str = "identity",
    ) -> RawResponse: ...

    async def model_metadata(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]: ...

    async def model_config(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]: ...

    async def model_ready(self, model: str, *, timeout_s: float, version: str = "") -> bool: ...

    async def server_metadata(self, *, timeout_s: float) -> dict[str, Any]: ...

    async def server_ready(self, *, timeout_s: float) -> bool: ...

    async def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]: ...

    async def statistics(
        self, *, timeout_s: float, model: str = "", version: str = ""
    ) -> list[dict[str, Any]]: ...

    async def reload_model(self, model: str, *, timeout_s: float) -> None:
        """Reload ``model`` through Triton's repository API with fresh instances (:func:`reload_config`)."""
        ...

    async def close(self) -> None: ...


def _triton_dtype(array: np.ndarray) -> str:
    return (
        "BYTES"
        if array.dtype == np.object_ or array.dtype.kind in "SU"
        else np_to_triton_dtype(array.dtype)
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
        self._raw = Http1Pool(url, limit=pool_size)

    async def _call(self, call: Awaitable[T], timeout_s: float, model: str | None = None) -> T:
        """What ``call`` (a client request) answers within ``timeout_s``; its errors translated."""
        try:
            async with asyncio.timeout(timeout_s):
                return await call
        except Exception as exc:
            raise translate_error(exc, model) from exc

    async def infer(
        self,
        model: str,
        inputs: Sequence[Tensor],
        outputs: Sequence[str] | None = None,
        *,
        timeout_s: float,
        version: str = "",
        priority: int = 0,
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` (binary tensors both ways).

        Args:
            model: the Triton model name.
            inputs: named arrays; shapes must include the batch axis where the model batches.
            outputs: names to return; every output when ``None``.
            timeout_s: the whole call's deadline; Triton gets it as the request timeout too.
            version: the model version to run ('' lets Triton's version policy choose).
            priority: Triton's request priority (1 first; 0 = the model's default level).

        Returns:
            Output name -> array.

        Raises:
            GatewayError: translated as the module docstring says.
        """
        infer_inputs = []
        for tensor in inputs:
            item = triton_aio.InferInput(
                tensor.name, list(tensor.data.shape), _triton_dtype(tensor.data)
            )
            item.set_data_from_numpy(tensor.data, binary_data=True)
            infer_inputs.append(item)
        requested = (
            [triton_aio.InferRequestedOutput(n, binary_data=True) for n in outputs]
            if outputs
            else None
        )
        call = self._client.infer(
            model,
            infer_inputs,
            model_version=version,
            outputs=requested,
            priority=priority,
            timeout=timeout_us(timeout_s),
        )
        result = await self._call(call, timeout_s, model)
        response = result.get_response()
        return {o["name"]: result.as_numpy(o["name"]) for o in response.get("outputs", [])}

    async def infer_v2(
        self,
        model: str,
        request: InferRequest,
        *,
        timeout_s: float,
        version: str = "",
        accept_encoding: str = "identity",
    ) -> RawResponse:
        """Send a checked KServe v2 request to ``model`` (re-encoded) and return Triton's answer as is.

        Args:
            model: the Triton model name.
            request: the checked request.
            timeout_s: the whole call's deadline.
            version: the model version ('' lets Triton's version policy choose).
            accept_encoding: ``gzip``, ``deflate`` or ``identity``: how Triton may compress its answer.

        Raises:
            GatewayError: translated as the module docstring says.
        """
        body, headers = encode_rest(request)
        # Triton compresses its answer only when the client asked for it.
        headers["Accept-Encoding"] = accept_encoding
        answer = await self._call(
            self._raw.post(_infer_path(model, version), body, headers), timeout_s, model
        )
        if answer.status != 200:
            raise from_status(answer.status, error_message(answer.body), model)
        out = {k: v for k, v in answer.headers.items() if k in _RESPONSE_HEADERS}
        return RawResponse(answer.body, out)

    async def model_metadata(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]:
        """Triton's KServe v2 metadata of ``model`` (of ``version``, when given)."""
        call = self._client.get_model_metadata(model, model_version=version)
        return dict(await self._call(call, timeout_s, model))

    async def model_config(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]:
        """Triton's configuration of ``model`` as JSON (the model configuration extension)."""
        call = self._client.get_model_config(model, model_version=version)
        return dict(await self._call(call, timeout_s, model))

    async def model_ready(self, model: str, *, timeout_s: float, version: str = "") -> bool:
        call = self._client.is_model_ready(model, model_version=version)
        return bool(await self._call(call, timeout_s, model))

    async def server_metadata(self, *, timeout_s: float) -> dict[str, Any]:
        """Triton's server metadata: name, version, extensions."""
        return dict(await self._call(self._client.get_server_metadata(), timeout_s))

    async def server_ready(self, *, timeout_s: float) -> bool:
        """Whether Triton says it is ready; ``False`` (never an error) when it cannot be reached."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self._client.is_server_ready())
        except Exception:  # a probe: unreachable, slow or broken all mean "not ready"
            return False

    async def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        return list(await self._call(self._client.get_model_repository_index(), timeout_s))

    async def statistics(
        self, *, timeout_s: float, model: str = "", version: str = ""
    ) -> list[dict[str, Any]]:
        """Triton's statistics extension (cumulative counters) for every loaded model, or for ``model``
        (its ``version``, when given)."""
        call = self._client.get_inference_statistics(model_name=model, model_version=version)
        stats = await self._call(call, timeout_s, model or None)
        return list(stats.get("model_stats", []))

    async def reload_model(self, model: str, *, timeout_s: float) -> None:
        await self._call(self._reload(model), timeout_s, model)

    async def _reload(self, model: str) -> None:
        config = await self._client.get_model_config(model)
        await self._client.load_model(model, config=reload_config(config))

    async def close(self) -> None:
        await self._client.close()
        await self._raw.close()


#: the config parameter a reload stamps (Unix time in ns); it only makes the reload a real one
RELOAD_PARAMETER = "reloaded_at_ns"


def reload_config(config: dict[str, Any]) -> str:
    """The load request's ``config`` that replaces every instance of a loaded model.

    Triton treats a load of an unchanged, loaded model as a no-op, and a load whose config differs
    only in its instance groups as an in-place update that keeps the existing instances: either
    leaves a dead stub in place. A changed parameter makes it load the model anew.
    """
    stamped = dict(config)
    stamped["parameters"] = {
        **(config.get("parameters") or {}),
        RELOAD_PARAMETER: {"string_value": str(time.time_ns())},
    }
    return json.dumps(stamped)


def timeout_us(timeout_s: float) -> int:
    """Triton's ``timeout`` request parameter for a deadline ``timeout_s`` away (at least 1 us)."""
    return max(1, int(timeout_s * 1_000_000))


def _infer_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}/infer" if version else f"{path}/infer"
