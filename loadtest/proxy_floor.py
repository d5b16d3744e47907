"""The floor under the gateway's CPU per request: the least a Python server pays per request.

``python -m loadtest.proxy_floor MODE --port P --triton-http HOST:PORT --triton-grpc HOST:PORT``
serves one of these ASGI apps under uvicorn as the gateway runs (httptools, uvloop where installed),
for :mod:`loadtest.gateway_profile`'s ``--floors``:

- ``server``: uvicorn alone; every request is answered at once with a fixed body (no upstream).
- ``aiohttp``: a raw ASGI proxy: the body is read and passed to Triton's HTTP endpoint by the
  gateway's own client library (aiohttp, one pooled session), Triton's answer passed back.
- ``pool``: the same raw proxy on the gateway's own connection pool to Triton
  (:mod:`gateway.backends.http1_pool`: asyncio protocols and httptools) instead of aiohttp.
- ``fastapi``: the same proxy as a FastAPI route that also parses the JSON body: the framework's cost.
- ``grpc``: a raw ASGI app that parses the JSON body and calls Triton over ``grpc.aio`` (a
  ``ModelInferRequest`` built from it; INT32 inputs only, as the profile's model takes).

None of them authenticates, limits, validates or records anything: they measure what a Python
proxy costs before any of the gateway's work, on the same machine, model and load. ``/healthz``
answers 200 without an upstream call (how the launcher knows the server is up).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

# At module level: FastAPI resolves the route's annotations (strings here) in this module's globals.
from fastapi import FastAPI, Request
from fastapi.responses import Response

__all__ = ["MODES", "build_app", "main"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MODES = ("server", "aiohttp", "pool", "fastapi", "grpc")
_JSON = [(b"content-type", b"application/json")]


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": _JSON})
    await send({"type": "http.response.body", "body": body})


def _raw(handle: Callable[[Scope, bytes], Awaitable[bytes]]) -> App:
    """A pure ASGI app: the body read whole, ``handle``'s bytes answered (no lifespan work)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await _body(receive)
        if scope["path"] == "/healthz":
            await _answer(send, b"{}")
            return
        await _answer(send, await handle(scope, body))

    return app


def _aiohttp_post(triton_http: str) -> Callable[[str, bytes], Awaitable[bytes]]:
    import aiohttp

    sessions: list[aiohttp.ClientSession] = []  # made on first use, inside the server's loop

    async def post(path: str, body: bytes) -> bytes:
        if not sessions:
            sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)))
        async with sessions[0].post(
            f"http://{triton_http}{path}", data=body, headers={"content-type": "application/json"}
        ) as response:
            return await response.read()

    return post


def _pool_post(triton_http: str) -> Callable[[str, bytes], Awaitable[bytes]]:
    from gateway.backends.http1_pool import Http1Pool

    pools: list[Http1Pool] = []  # made on first use, inside the server's loop

    async def post(path: str, body: bytes) -> bytes:
        if not pools:
            pools.append(Http1Pool(triton_http, limit=64))
        answer = await pools[0].post(path, body, {"Content-Type": "application/json"})
        return answer.body

    return post


def _grpc_infer(triton_grpc: str) -> Callable[[Scope, bytes], Awaitable[bytes]]:
    import grpc
    import numpy as np
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    stubs: list[Any] = []

    async def infer(scope: Scope, body: bytes) -> bytes:
        if not stubs:
            channel = grpc.aio.insecure_channel(triton_grpc)
            stubs.append(service_pb2_grpc.GRPCInferenceServiceStub(channel))
        document = json.loads(body)
        request = service_pb2.ModelInferRequest(model_name=scope["path"].split("/")[3])
        for tensor in document["inputs"]:
            request.inputs.add(name=tensor["name"], datatype="INT32", shape=tensor["shape"])
            request.raw_input_contents.append(np.asarray(tensor["data"], np.int32).tobytes())
        reply = await stubs[0].ModelInfer(request, timeout=30)
        outputs = [
            {
                "name": o.name,
                "datatype": o.datatype,
                "shape": list(o.shape),
                "data": np.frombuffer(raw, np.int32).tolist(),
            }
            for o, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)
        ]
        return json.dumps({"model_name": reply.model_name, "outputs": outputs}).encode()

    return infer


def _fastapi(triton_http: str) -> App:
    app = FastAPI()
    post = _aiohttp_post(triton_http)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {}

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request) -> Response:
        body = await request.body()
        json.loads(body)  # what any route that looks at the body pays
        return Response(
            await post(f"/v2/models/{model}/infer", body), media_type="application/json"
        )

    return app  # type: ignore[return-value]


def build_app(mode: str, triton_http: str, triton_grpc: str) -> App:
    """The ASGI app of ``mode`` (one of :data:`MODES`)."""
    if mode == "server":

        async def fixed(scope: Scope, body: bytes) -> bytes:
            return b'{"outputs":[]}'

        return _raw(fixed)
    if mode in ("aiohttp", "pool"):
        post = _aiohttp_post(triton_http) if mode == "aiohttp" else _pool_post(triton_http)

        async def forward(scope: Scope, body: bytes) -> bytes:
            return await post(scope["path"], body)

        return _raw(forward)
    if mode == "fastapi":
        return _fastapi(triton_http)
    if mode == "grpc":
        return _raw(_grpc_infer(triton_grpc))
    raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--triton-http", required=True, help="HOST:PORT of Triton's HTTP endpoint")
    parser.add_argument("--triton-grpc", required=True, help="HOST:PORT of Triton's gRPC endpoint")
    args = parser.parse_args(argv)
    app = build_app(args.mode, args.triton_http, args.triton_grpc)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
