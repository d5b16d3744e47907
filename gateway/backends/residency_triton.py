"""Triton's model repository extension, as the residency manager needs it: load, unload (and wait
until the model is really gone), the repository index, and an ensemble's steps.

Triton answers an unload at once and goes on unloading in the background (the index says
``UNLOADING``); a Python-backend model's memory is freed only when its stub processes exit, which
is when the index says ``UNAVAILABLE``. :meth:`TritonRepository.unload` waits for that, so memory
measured afterwards no longer holds the model. tritonclient errors become :mod:`gateway.errors`
at this boundary.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tritonclient.http.aio as triton_aio

from gateway.backends.triton import translate_error
from gateway.errors import UpstreamTimeout

__all__ = ["TritonRepository"]

_POLL_S = 0.05


class TritonRepository:
    """Load and unload models on one Triton instance (HTTP, explicit model-control mode).

    Args:
        url: ``host:port`` of Triton's HTTP endpoint.
        timeout_s: the deadline of one load or unload (a cold load may take long).
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self._client = triton_aio.InferenceServerClient(url, conn_limit=4)
        self.timeout_s = timeout_s

    async def index(self) -> dict[str, dict[str, Any]]:
        """Triton's repository index by model name."""
        try:
            async with asyncio.timeout(self.timeout_s):
                entries = await self._client.get_model_repository_index()
        except Exception as exc:
            raise translate_error(exc) from exc
        return {str(e["name"]): dict(e) for e in entries if "name" in e}

    async def load(self, model: str) -> None:
        """Load ``model`` (Triton loads an ensemble's steps with it); returns once it is READY."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._client.load_model(model)
        except Exception as exc:
            raise translate_error(exc, model) from exc

    async def unload(self, model: str) -> None:
        """Unload ``model`` alone and wait until Triton's index no longer says it is unloading.

        Raises:
            UpstreamTimeout: it was still unloading after ``timeout_s``.
        """
        deadline = time.monotonic() + self.timeout_s
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._client.unload_model(model, unload_dependents=False)
        except Exception as exc:
            raise translate_error(exc, model) from exc
        while time.monotonic() < deadline:
            state = (await self.index()).get(model, {}).get("state")
            if state not in ("UNLOADING", "READY"):
                return
            await asyncio.sleep(_POLL_S)  # polling Triton's state, not synchronising a test
        raise UpstreamTimeout(f"model '{model}' was still unloading after {self.timeout_s:g} s")

    async def steps(self, model: str) -> tuple[str, ...]:
        """The models a loaded ensemble runs (empty for any other model)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                config = await self._client.get_model_config(model)
        except Exception as exc:
            raise translate_error(exc, model) from exc
        scheduling = config.get("ensemble_scheduling") or {}
        return tuple(
            dict.fromkeys(
                str(s["model_name"]) for s in scheduling.get("step", []) if "model_name" in s
            )
        )

    async def close(self) -> None:
        await self._client.close()
