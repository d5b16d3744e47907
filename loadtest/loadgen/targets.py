"""What a closed loop sends: a target opens its clients once per process and sends one request per call.

- :class:`TritonTarget`: a model behind the KServe v2 protocol (Triton, or the gateway's
  passthrough), through tritonclient's asyncio clients: HTTP with binary tensors (or JSON) or gRPC,
  optionally with the tensors in shared memory (:mod:`loadtest.loadgen.shm`).
- :class:`HttpTarget`: ready-made HTTP requests (any route: the gateway's OpenAI and image routes,
  the naive baseline, hostile bodies), through aiohttp; answers keep their status and Retry-After.

Targets are frozen dataclasses of plain data (and module-level functions), so they can be sent to
the load generator's worker processes. A target's ``connect(concurrency)`` is an async context
manager yielding ``send(worker, index) -> Outcome``; ``index`` picks the request (round robin).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from loadtest.loadgen.shm import KINDS, Region, region_name
from serving.triton_clients import triton_client

__all__ = ["HttpTarget", "Outcome", "Send", "Target", "TritonTarget"]

Outcome = tuple[int, float | None, bool | None, str | None]
"""``(status, retry_after_s, correct, error message)``; status 200 is success, 0 no answer."""
Send = Callable[[int, int], Awaitable[Outcome]]

# gRPC status -> the HTTP status KServe's REST protocol uses for the same error.
_GRPC_TO_HTTP = {
    "StatusCode.INVALID_ARGUMENT": 400,
    "StatusCode.UNAUTHENTICATED": 401,
    "StatusCode.PERMISSION_DENIED": 403,
    "StatusCode.NOT_FOUND": 404,
    "StatusCode.RESOURCE_EXHAUSTED": 429,
    "StatusCode.UNIMPLEMENTED": 501,
    "StatusCode.UNAVAILABLE": 503,
    "StatusCode.DEADLINE_EXCEEDED": 504,
    "StatusCode.CANCELLED": 499,
}


class Target(Protocol):
    @property
    def name(self) -> str: ...

    def connect(self, concurrency: int) -> contextlib.AbstractAsyncContextManager[Send]: ...

    def describe(self) -> str: ...


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: none of our servers sends one


@dataclass(frozen=True, kw_only=True)
class HttpTarget:
    """POSTs of ready-made bodies.

    Args:
        url: the full URL.
        requests: ``(body, headers)`` pairs, sent round robin.
        headers: added to every request (credentials).
        check: ``check(status, body) -> bool | None`` marks answers right or wrong (``None``: unchecked).
        timeout_s: per request; a request that takes longer counts as no answer (status 0).
        source_address: the local address connections leave from (``None``: the system's choice);
            another loopback address (127.0.0.2) makes a second client the server tells apart.
    """

    url: str
    requests: tuple[tuple[bytes, Mapping[str, str]], ...]
    headers: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[int, bytes], bool | None] | None = None
    timeout_s: float = 120.0
    name: str = "http"
    source_address: str | None = None

    def describe(self) -> str:
        sizes = sorted({len(body) for body, _ in self.requests})
        size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
        return f"HTTP/1.1 POST (aiohttp), {len(self.requests)} bodies of {size} bytes"

    @contextlib.asynccontextmanager
    async def connect(self, concurrency: int) -> AsyncIterator[Send]:
        import aiohttp

        prepared = [(body, {**headers, **self.headers}) for body, headers in self.requests]
        local = None if self.source_address is None else (self.source_address, 0)
        connector = aiohttp.TCPConnector(limit=concurrency, local_addr=local)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        check = self.check
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def send(worker: int, index: int) -> Outcome:
                body, headers = prepared[index % len(prepared)]
                try:
                    async with session.post(self.url, data=body, headers=headers) as response:
                        payload = await response.read()
                        status = response.status
                        retry_after = _retry_after(response.headers.get("Retry-After"))
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    return 0, None, None, f"no answer: {exc!r}"
                correct = check(status, payload) if check is not None else None
                message = None if status == 200 else payload[:300].decode(errors="replace")
                return status, retry_after, correct, message

            yield send


def _payload_bytes(array: np.ndarray) -> int:
    """What an input carries: its bytes, or for BYTES tensors the bytes of its elements."""
    if array.dtype == np.object_:
        return sum(len(item) for item in array.flat)
    return int(array.nbytes)


@dataclass(frozen=True, kw_only=True)
class TritonTarget:
    """Inference requests for one model through tritonclient's asyncio clients.

    Args:
        url: ``host:port`` of the HTTP or gRPC endpoint (Triton's, or the gateway's for HTTP).
        model: the model (and ``model_version``) to call.
        inputs: one ``{input name: array}`` per distinct request, sent round robin; arrays carry
            the batch dimension.
        outputs: outputs to ask for (all when empty).
        protocol: ``http`` or ``grpc``.
        binary: HTTP only: binary tensor extension (``True``) or JSON.
        shared_memory: a kind of :data:`loadtest.loadgen.shm.KINDS` (``system``), or ``None``.
        shared_outputs: with ``shared_memory``, the outputs are written there too (as perf_analyzer
            does); ``False``: only the inputs, and the answers come back in the response body (a
            small answer then costs Triton no copy into the client's region per request).
        headers: sent with every request (HTTP headers or gRPC metadata), e.g. credentials.
        check: ``check({output name: array}) -> bool`` marks answers right or wrong.
        priority: Triton's request priority (1 is served first; 0 sends none: the model's default
            level, the lowest in the platform's configs, whose queue is the shortest).
    """

    url: str
    model: str
    inputs: tuple[Mapping[str, np.ndarray], ...]
    outputs: tuple[str, ...] = ()
    protocol: str = "http"
    binary: bool = True
    shared_memory: str | None = None
    shared_outputs: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)
    model_version: str = ""
    check: Callable[[Mapping[str, np.ndarray]], bool] | None = None
    timeout_s: float = 120.0
    name: str = "triton"
    priority: int = 0

    def __post_init__(self) -> None:
        if self.protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be http or grpc, not {self.protocol!r}")
        if self.shared_memory is not None and self.shared_memory not in KINDS:
            raise ValueError(
                f"unknown shared memory kind {self.shared_memory!r}; known: {', '.join(KINDS)}"
            )
        if not self.inputs:
            raise ValueError("a TritonTarget needs at least one request's inputs")

    def describe(self) -> str:
        client = f"tritonclient.{self.protocol}.aio"
        if self.shared_memory:
            payload = f"{self.shared_memory} shared memory"
            payload += "" if self.shared_outputs else " (inputs; outputs in the body)"
        elif self.protocol == "grpc":
            payload = "protobuf tensors"
        else:
            payload = "KServe v2 binary tensors" if self.binary else "KServe v2 JSON"
        sizes = [sum(_payload_bytes(a) for a in request.values()) for request in self.inputs]
        span = f"{min(sizes):,}" if min(sizes) == max(sizes) else f"{min(sizes):,}-{max(sizes):,}"
        return f"{client}, {payload}, {len(self.inputs)} requests of {span} input bytes"

    @contextlib.asynccontextmanager
    async def connect(self, concurrency: int) -> AsyncIterator[Send]:
        module = _client_module(self.protocol)
        if self.protocol == "http":
            client = triton_client(
                self.url, "http.aio", conn_limit=concurrency, conn_timeout=self.timeout_s
            )
        else:
            client = triton_client(self.url, "grpc.aio")
        regions: list[Region] = []
        memory = KINDS[self.shared_memory]() if self.shared_memory else None
        answers = memory if self.shared_outputs else None  # where the outputs are written
        try:
            # Metadata only where sizes or names must be known: a gateway may not serve it.
            output_specs: list[tuple[str, str, list[int]]]
            if memory is None and (self.outputs or self.check is None):
                output_specs = [(name, "", []) for name in self.outputs]
            else:
                output_specs = await self._output_specs(client)
            if memory is None:
                requests = [self._inputs(module, arrays) for arrays in self.inputs]
            else:
                requests = [
                    await self._inputs_in_memory(memory, client, module, arrays, regions)
                    for arrays in self.inputs
                ]
            worker_outputs = [
                await self._outputs(module, answers, client, output_specs, regions)
                for _ in range(concurrency if answers is not None else 1)
            ]
            yield self._sender(client, module, requests, worker_outputs, output_specs, answers)
        finally:
            for region in regions:
                assert memory is not None
                with contextlib.suppress(
                    Exception
                ):  # the server may be gone; the memory is ours to free
                    await memory.unregister(client, region)
                memory.destroy(region)
            await client.close()

    def _sender(
        self,
        client: Any,
        module: Any,
        requests: list[list[Any]],
        worker_outputs: list[tuple[Any, Any]],
        output_specs: list[tuple[str, str, list[int]]],
        memory: Any,
    ) -> Send:
        from tritonclient.utils import InferenceServerException

        transport_errors = _transport_errors(self.protocol)
        options: dict[str, Any] = {"model_version": self.model_version}
        if self.priority:
            options["priority"] = self.priority
        if self.protocol == "grpc":
            options["client_timeout"] = self.timeout_s
        check = self.check

        async def send(worker: int, index: int) -> Outcome:
            outputs, regions = worker_outputs[worker % len(worker_outputs)]
            try:
                result = await client.infer(
                    self.model,
                    requests[index % len(requests)],
                    outputs=outputs,
                    headers=dict(self.headers) or None,
                    **options,
                )
            except InferenceServerException as exc:
                return _status(exc), None, None, str(exc.message())[:300]
            except transport_errors as exc:
                return 0, None, None, f"no answer: {exc!r}"
            if check is None:
                return 200, None, None, None
            if memory is not None:
                values = {
                    name: memory.read(region, datatype, shape)
                    for (name, datatype, shape), region in zip(output_specs, regions, strict=True)
                }
            else:
                values = {name: result.as_numpy(name) for name, _, _ in output_specs}
            return 200, None, bool(check(values)), None

        return send

    def _inputs(self, module: Any, arrays: Mapping[str, np.ndarray]) -> list[Any]:
        from tritonclient.utils import np_to_triton_dtype

        tensors = []
        for name, array in arrays.items():
            tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            if self.protocol == "http":
                tensor.set_data_from_numpy(array, binary_data=self.binary)
            else:
                tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return tensors

    async def _inputs_in_memory(
        self,
        memory: Any,
        client: Any,
        module: Any,
        arrays: Mapping[str, np.ndarray],
        regions: list[Region],
    ) -> list[Any]:
        from tritonclient.utils import np_to_triton_dtype

        region = memory.create(region_name("in"), sum(a.nbytes for a in arrays.values()))
        regions.append(region)
        memory.write(region, list(arrays.values()))
        await memory.register(client, region)
        tensors, offset = [], 0
        for name, array in arrays.items():
            tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_shared_memory(region.name, array.nbytes, offset)
            tensors.append(tensor)
            offset += array.nbytes
        return tensors

    async def _output_specs(self, client: Any) -> list[tuple[str, str, list[int]]]:
        """``(name, datatype, shape)`` of each output asked for, the batch taken from the first input."""
        if self.protocol == "grpc":
            metadata = await client.get_model_metadata(
                self.model, self.model_version, as_json=True, headers=dict(self.headers) or None
            )
        else:
            metadata = await client.get_model_metadata(
                self.model, self.model_version, headers=dict(self.headers) or None
            )
        batch = next(iter(self.inputs[0].values())).shape[0]
        wanted = set(self.outputs)
        specs = []
        for out in metadata["outputs"]:
            if wanted and out["name"] not in wanted:
                continue
            shape = [int(d) for d in out["shape"]]
            if shape and shape[0] == -1:
                shape[0] = batch
            specs.append((out["name"], out["datatype"], shape))
        if wanted - {name for name, _, _ in specs}:
            raise ValueError(
                f"{self.model} has no output(s) {sorted(wanted - {n for n, _, _ in specs})}"
            )
        return specs

    async def _outputs(
        self,
        module: Any,
        memory: Any,
        client: Any,
        specs: list[tuple[str, str, list[int]]],
        regions: list[Region],
    ) -> tuple[Any, list[Region]]:
        from tritonclient.utils import triton_to_np_dtype

        requested, own = [], []
        for name, datatype, shape in specs:
            output = (
                module.InferRequestedOutput(name, binary_data=True)
                if self.protocol == "http"
                else module.InferRequestedOutput(name)
            )
            if memory is not None:
                if any(d < 0 for d in shape) or datatype == "BYTES":
                    raise ValueError(
                        f"output {name} of {self.model} has no fixed size ({datatype} {shape}): "
                        "shared memory needs one"
                    )
                size = int(math.prod(shape)) * np.dtype(triton_to_np_dtype(datatype)).itemsize
                region = memory.create(region_name("out"), size)
                regions.append(region)
                own.append(region)
                await memory.register(client, region)
                output.set_shared_memory(region.name, size)
            requested.append(output)
        return requested, own


def _client_module(protocol: str) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc.aio as grpc_aio

        return grpc_aio
    import tritonclient.http.aio as http_aio

    return http_aio


def _transport_errors(protocol: str) -> tuple[type[BaseException], ...]:
    if protocol == "grpc":
        return (TimeoutError, OSError)
    import aiohttp

    return (aiohttp.ClientError, TimeoutError, OSError)


def _status(exc: Any) -> int:
    status = str(exc.status() or "")
    if status.isdigit():
        return int(status)
    return _GRPC_TO_HTTP.get(status, 500 if status else 0)
