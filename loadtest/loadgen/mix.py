"""A target that spreads requests over many models in a fixed order (the multi-model benchmark's
Zipf draws): KServe v2 JSON through the gateway, one model per request.

``correct`` in each outcome says whether the answer came without waiting for a load: the gateway's
``Server-Timing`` header names a ``load`` stage only when the request waited for its model to be
loaded on demand (:mod:`gateway.backends.residency`). So the samples split into hits (``correct`` 1) and
cold requests (``correct`` 0) with no second bookkeeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from loadtest.loadgen.targets import Outcome, Send, _retry_after

__all__ = ["ModelMixTarget", "waited_for_load"]


def waited_for_load(server_timing: str | None) -> bool:
    """Whether a ``Server-Timing`` value has the gateway's ``load`` stage."""
    return any(part.strip().startswith("load;") for part in (server_timing or "").split(","))


@dataclass(frozen=True, kw_only=True)
class ModelMixTarget:
    """POSTs of one body to ``{base_url}/v2/models/{model}/infer``, ``model`` = ``sequence[index]``.

    Args:
        base_url: the gateway, e.g. ``http://127.0.0.1:8080``.
        sequence: the model of each request, in order (cycled).
        body: the KServe v2 JSON request every model takes.
        headers: credentials.
        timeout_s: per request; longer counts as no answer (status 0).
    """

    base_url: str
    sequence: tuple[str, ...]
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0
    name: str = "model-mix"

    def describe(self) -> str:
        return f"KServe v2 JSON over {len(set(self.sequence))} models (aiohttp), {len(self.body)} bytes"

    @contextlib.asynccontextmanager
    async def connect(self, concurrency: int) -> AsyncIterator[Send]:
        import aiohttp

        headers = {"Content-Type": "application/json", **self.headers}
        connector = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def send(worker: int, index: int) -> Outcome:
                model = self.sequence[index % len(self.sequence)]
                try:
                    async with session.post(
                        f"{self.base_url}/v2/models/{model}/infer", data=self.body, headers=headers
                    ) as response:
                        payload = await response.read()
                        status = response.status
                        retry_after = _retry_after(response.headers.get("Retry-After"))
                        hit = not waited_for_load(response.headers.get("Server-Timing"))
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    return 0, None, None, f"no answer: {exc!r}"
                if status != 200:
                    return status, retry_after, None, payload[:300].decode(errors="replace")
                return status, retry_after, hit, None

            yield send
