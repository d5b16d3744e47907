"""The KServe v2 gRPC entry: ``inference.GRPCInferenceService`` served by the gateway itself.

A ``grpc.aio`` server in the gateway's process and event loop (started and stopped by the app's
lifespan, on ``GATEWAY_GRPC_PORT``), so ``tritonclient.grpc`` and ``tritonclient.grpc.aio`` work
against the gateway unchanged. It is a second door to the same house, not a second house:

- authentication: the ``authorization`` metadata (``Bearer <api key | JWT>``) or ``x-api-key``,
  checked by the same :class:`~gateway.tenancy.auth.Authenticator` as HTTP;
- scopes, rate limits, the in-flight bound and the request checks: the same
  :class:`~gateway.tasks.service.InferenceService` calls as the REST routes (a ``ModelInferRequest`` is
  checked by the REST parser's own rules, see :mod:`gateway.protocol.kserve`);
- statistics: each admitted call is recorded in the same tracker, labelled with the HTTP status its
  outcome has on REST;
- errors: the gateway's exception tree gives the HTTP status through the app's one table, and
  :data:`GRPC_STATUS` turns that status into a gRPC code. ``Retry-After`` and the ``RateLimit-*``
  fields travel as trailing metadata.

Health (``ServerLive``, ``ServerReady``) needs no credential, as on REST. ``RepositoryIndex`` and
``ModelStatistics`` pass Triton's answers through for the admin credential only (PERMISSION_DENIED for
an API key), as on REST. Calls the gateway does not serve (repository control, shared memory,
tracing, logging) answer UNIMPLEMENTED with a message saying so.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from gateway.errors import GatewayError
from gateway.http.problems import ProblemRenderer
from gateway.observe.stats import LatencyTracker
from gateway.protocol.kserve import GrpcBody, response_from_rest
from gateway.settings import GatewaySettings
from gateway.tasks.service import InferenceService
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.context import Principal, RequestContext
from gateway.tenancy.usage import UsageMeter

__all__ = ["GRPC_STATUS", "KServeGrpcServicer", "start_grpc_server"]

log = logging.getLogger(__name__)
access_log = logging.getLogger("gateway.access")

T = TypeVar("T")
M = TypeVar("M", bound=Message)

#: HTTP status (from the app's one exception table) -> gRPC status code.
GRPC_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

_NOT_SERVED = {
    "RepositoryModelLoad": "models are loaded by the operator, not through the gateway",
    "RepositoryModelUnload": "models are unloaded by the operator, not through the gateway",
    "SystemSharedMemoryStatus": "shared memory cannot be used through the gateway; send the data",
    "SystemSharedMemoryRegister": "shared memory cannot be used through the gateway; send the data",
    "SystemSharedMemoryUnregister": "shared memory cannot be used through the gateway; send the data",
    "CudaSharedMemoryStatus": "shared memory cannot be used through the gateway; send the data",
    "CudaSharedMemoryRegister": "shared memory cannot be used through the gateway; send the data",
    "CudaSharedMemoryUnregister": "shared memory cannot be used through the gateway; send the data",
    "TraceSetting": "tracing is not served through the gateway",
    "LogSettings": "log settings are not served through the gateway",
}


class _Call:
    """One RPC's context, outcome and bookkeeping (the gRPC twin of the context middleware)."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.ctx = RequestContext(request_id=uuid.uuid4().hex[:16])
        self.status = 200
        self.metadata = {key.lower(): value for key, value in (context.invocation_metadata() or ())}

    def deadline_us(self) -> int | None:
        remaining = self.context.time_remaining()
        return None if remaining is None else max(0, int(remaining * 1_000_000))


def _not_served(name: str) -> Callable[..., Awaitable[Any]]:
    async def method(self: KServeGrpcServicer, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_SERVED[name])

    method.__name__ = name
    return method


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class KServeGrpcServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` on top of the gateway's service layer.

    Args:
        service: the data plane the REST routes use.
        authenticator: checks credentials.
        renderer: the app's error table (exception -> HTTP status).
        tracker: latency statistics.
        meter: usage metering (per key, model and day).
        server_timing: whether authenticated calls get a ``server-timing`` trailer
            (:mod:`gateway.observe.timing`).
    """

    service: InferenceService
    authenticator: Authenticator
    renderer: ProblemRenderer
    tracker: LatencyTracker
    meter: UsageMeter | None = None
    server_timing: bool = True

    # -- the plumbing every method shares --------------------------------------------------

    async def _run(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        empty: T,
        handler: Callable[[RequestContext, _Call], Awaitable[T]],
        *,
        public: bool = False,
    ) -> T:
        call = _Call(method, context)
        try:
            if not public:
                with call.ctx.stages.stage("auth"):
                    call.ctx.principal = await self.authenticator.authenticate(call.metadata)
            result = await handler(call.ctx, call)
            self._trailers(call, {})
            return result
        except GatewayError as exc:
            report = self.renderer.report(exc)
            call.status = report.status
            self._trailers(call, report.headers)
            context.set_code(GRPC_STATUS.get(report.status, grpc.StatusCode.UNKNOWN))
            context.set_details(report.detail)
            if report.status >= 500:
                log.warning("gRPC %s -> %d: %s", method, report.status, report.detail)
            return empty
        except asyncio.CancelledError:
            call.status = 499  # the client went away or its deadline passed
            raise
        except Exception:  # never relabelled as a client error: INTERNAL, logged with the traceback
            log.exception("unhandled error on gRPC %s", method)
            call.status = 500
            context.set_code(grpc.StatusCode.INTERNAL)
            context.set_details("the gateway failed; see its log")
            return empty
        finally:
            self._finish(call)

    def _trailers(self, call: _Call, headers: Any) -> None:
        fields = {**(call.ctx.rate.headers() if call.ctx.rate is not None else {}), **dict(headers)}
        fields.pop("content-type", None)
        fields["x-request-id"] = call.ctx.request_id
        if self.server_timing and call.ctx.principal is not None:
            fields["server-timing"] = call.ctx.stages.header(time.perf_counter() - call.ctx.started)
        call.context.set_trailing_metadata(tuple((k.lower(), str(v)) for k, v in fields.items()))

    def _finish(self, call: _Call) -> None:
        ctx = call.ctx
        elapsed = time.perf_counter() - ctx.started
        client = ctx.principal.client_id if ctx.principal else "-"
        if ctx.admitted and ctx.model is not None:
            self.tracker.record(ctx.model, client, call.status, elapsed, ctx.stages.seconds)
            if self.meter is not None:
                self.meter.record(
                    client, ctx.model, call.status, ctx.usage, ctx.stages.get("upstream")
                )
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "%s gRPC %s %d %.2fms client=%s model=%s",
                ctx.request_id,
                call.method,
                call.status,
                elapsed * 1000,
                client,
                ctx.model or "-",
            )

    async def _json_read(
        self,
        method: str,
        context: Any,
        response: type[M],
        read: Callable[[RequestContext], Awaitable[dict[str, Any]]],
    ) -> M:
        """``method`` answered with the JSON document ``read`` gives, parsed into ``response``."""

        async def handler(ctx: RequestContext, call: _Call) -> M:
            return json_format.ParseDict(await read(ctx), response(), ignore_unknown_fields=True)

        return await self._run(method, context, response(), handler)

    async def _infer(
        self, ctx: RequestContext, call: _Call, request: pb.ModelInferRequest
    ) -> pb.ModelInferResponse:
        raw = await self.service.infer_v2(
            ctx,
            request.model_name,
            GrpcBody(request, deadline_us=call.deadline_us()),
            version=request.model_version,
        )
        return response_from_rest(raw.body, raw.headers)

    # -- health and metadata ----------------------------------------------------------------

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        async def handler(ctx: RequestContext, call: _Call) -> pb.ServerLiveResponse:
            return pb.ServerLiveResponse(live=True)

        return await self._run("ServerLive", context, pb.ServerLiveResponse(), handler, public=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        async def handler(ctx: RequestContext, call: _Call) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=await self.service.ready())

        return await self._run(
            "ServerReady", context, pb.ServerReadyResponse(), handler, public=True
        )

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        async def handler(ctx: RequestContext, call: _Call) -> pb.ServerMetadataResponse:
            meta = await self.service.server_metadata(ctx)
            return pb.ServerMetadataResponse(
                name=meta["name"], version=meta["version"], extensions=meta["extensions"]
            )

        return await self._run("ServerMetadata", context, pb.ServerMetadataResponse(), handler)

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        async def handler(ctx: RequestContext, call: _Call) -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(
                ready=await self.service.model_ready(ctx, request.name, request.version)
            )

        return await self._run("ModelReady", context, pb.ModelReadyResponse(), handler)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        return await self._json_read(
            "ModelMetadata",
            context,
            pb.ModelMetadataResponse,
            lambda ctx: self.service.model_metadata(ctx, request.name, request.version),
        )

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Any
    ) -> pb.ModelConfigResponse:
        async def handler(ctx: RequestContext, call: _Call) -> pb.ModelConfigResponse:
            config = await self.service.model_config(ctx, request.name, request.version)
            parsed = json_format.ParseDict(config, mc.ModelConfig(), ignore_unknown_fields=True)
            return pb.ModelConfigResponse(config=parsed)

        return await self._run("ModelConfig", context, pb.ModelConfigResponse(), handler)

    # -- operator reads (the admin credential) ------------------------------------------------

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        async def read(ctx: RequestContext) -> dict[str, Any]:
            return {"models": await self.service.repository_index(ctx, ready_only=request.ready)}

        return await self._json_read("RepositoryIndex", context, pb.RepositoryIndexResponse, read)

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        async def read(ctx: RequestContext) -> dict[str, Any]:
            return {
                "model_stats": await self.service.statistics(ctx, request.name, request.version)
            }

        return await self._json_read("ModelStatistics", context, pb.ModelStatisticsResponse, read)

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        async def handler(ctx: RequestContext, call: _Call) -> pb.ModelInferResponse:
            return await self._infer(ctx, call, request)

        return await self._run("ModelInfer", context, pb.ModelInferResponse(), handler)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request of the stream goes through the same path as ``ModelInfer`` (its own admission,
        rate-limit token and statistics); a refused one answers with ``error_message`` and the stream
        goes on, as Triton's own stream does."""
        metadata = {key.lower(): value for key, value in (context.invocation_metadata() or ())}
        try:
            principal: Principal = await self.authenticator.authenticate(metadata)
        except GatewayError as exc:
            context.set_code(
                GRPC_STATUS.get(self.renderer.status_for(exc), grpc.StatusCode.UNKNOWN)
            )
            context.set_details(exc.detail)
            return
        async for request in request_iterator:
            call = _Call("ModelStreamInfer", context)
            call.ctx.principal = principal
            try:
                response = await self._infer(call.ctx, call, request)
                yield pb.ModelStreamInferResponse(infer_response=response)
            except GatewayError as exc:
                call.status = self.renderer.status_for(exc)
                yield pb.ModelStreamInferResponse(
                    error_message=exc.detail, infer_response=pb.ModelInferResponse(id=request.id)
                )
            finally:
                self._finish(call)

    # -- what the gateway does not serve -----------------------------------------------------

    RepositoryModelLoad = _not_served("RepositoryModelLoad")
    RepositoryModelUnload = _not_served("RepositoryModelUnload")
    SystemSharedMemoryStatus = _not_served("SystemSharedMemoryStatus")
    SystemSharedMemoryRegister = _not_served("SystemSharedMemoryRegister")
    SystemSharedMemoryUnregister = _not_served("SystemSharedMemoryUnregister")
    CudaSharedMemoryStatus = _not_served("CudaSharedMemoryStatus")
    CudaSharedMemoryRegister = _not_served("CudaSharedMemoryRegister")
    CudaSharedMemoryUnregister = _not_served("CudaSharedMemoryUnregister")
    TraceSetting = _not_served("TraceSetting")
    LogSettings = _not_served("LogSettings")


async def start_grpc_server(
    settings: GatewaySettings,
    service: InferenceService,
    authenticator: Authenticator,
    renderer: ProblemRenderer,
    tracker: LatencyTracker,
    meter: UsageMeter | None = None,
) -> grpc.aio.Server:
    """Start the gRPC entry on ``settings.host:settings.grpc_port`` in the running event loop.

    Messages are capped at ``max_body_bytes`` like REST bodies (larger ones: RESOURCE_EXHAUSTED).

    Raises:
        RuntimeError: the port cannot be bound.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            ("grpc.max_send_message_length", -1),
        ],
        maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        KServeGrpcServicer(
            service, authenticator, renderer, tracker, meter, settings.server_timing
        ),
        server,
    )
    address = f"{settings.host}:{settings.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"the gRPC entry cannot listen on {address}: {exc}") from exc
    await server.start()
    log.info("KServe v2 gRPC entry listening on %s", address)
    return server
