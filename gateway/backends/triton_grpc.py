"""Talking to Triton over gRPC: :class:`TritonGrpcBackend`, the other :class:`InferenceBackend`.

Chosen with ``GATEWAY_TRITON_PROTOCOL=grpc``; clients still reach the gateway over HTTP, and every
route behaves as with the HTTP transport:

- requests are built as ``ModelInferRequest`` protobufs straight from the checked
  :class:`gateway.protocol.kserve.InferRequest` (tensor bytes go into ``raw_input_contents`` untouched), on
  a few ``grpc.aio`` channels used in turn (one HTTP/2 channel serialises bursts on one connection);
- answers to KServe v2 requests are encoded in the REST shape Triton's HTTP endpoint would have
  used (JSON ``data``, or the binary extension per output as the request asked; gzip/deflate when the
  client accepts it), so the routes cannot tell the transports apart;
- gRPC status codes map to the HTTP statuses Triton's HTTP endpoint gives the same error, then go
  through the same translation as the HTTP transport (:func:`gateway.backends.triton_errors.translate_error`).

Non-UTF-8 bytes in a BYTES output asked for as JSON are replaced (U+FFFD); ask for the output in
binary to get them exactly.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import zlib
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

from gateway.backends.triton import RawResponse, Tensor, reload_config, timeout_us
from gateway.backends.triton_errors import translate_error
from gateway.errors import GatewayError, UpstreamUnavailable
from gateway.protocol.kserve import HEADER_LENGTH, InferRequest, InputTensor
from gateway.protocol.kserve._grpc import infer_parameter
from gateway.protocol.kserve._types import numpy_dtype

__all__ = ["TritonGrpcBackend", "grpc_error"]


# How Triton's HTTP endpoint reports the error its gRPC endpoint reports with each status code.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
}
# What grpc says when no connection to Triton could be made (as opposed to Triton saying UNAVAILABLE).
_UNREACHABLE = (
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "socket closed",
)
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


def grpc_error(exc: grpc.aio.AioRpcError, model: str | None = None) -> GatewayError:
    """Map a failed gRPC call to the gateway's hierarchy, as the HTTP transport maps the same error."""
    code, details = exc.code(), exc.details() or ""
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return translate_error(TimeoutError(details), model)
    if code is grpc.StatusCode.UNAVAILABLE and any(s in details.lower() for s in _UNREACHABLE):
        return UpstreamUnavailable("Triton is unreachable", retry_after_s=1)
    status = _HTTP_STATUS.get(code, 500)
    return translate_error(InferenceServerException(msg=details, status=str(status)), model)


def _protobuf_request(
    model: str, version: str, request: InferRequest
) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request.id)
    for key, value in request.parameters.items():
        message.parameters[key].CopyFrom(infer_parameter(value))
    if request.timeout_us is not None:
        message.parameters["timeout"].int64_param = request.timeout_us
    if request.priority is not None:
        message.parameters["priority"].uint64_param = request.priority
    for tensor in request.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        message.raw_input_contents.append(tensor.raw())
    for output in request.outputs:
        entry = message.outputs.add(name=output.name)
        if output.class_count:
            entry.parameters["classification"].int64_param = output.class_count
    return message


def _json_values(datatype: str, raw: bytes) -> list[Any]:
    if datatype == "BYTES":
        values = deserialize_bytes_tensor(raw) if raw else np.empty(0, dtype=np.object_)
        return [
            v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in values
        ]
    array = np.frombuffer(raw, dtype=numpy_dtype(datatype))
    if datatype in ("FP16", "BF16"):
        array = array.astype(np.float32)  # JSON numbers; ml_dtypes' bfloat16 does not serialise
    return array.tolist()  # type: ignore[no-any-return]


def _parameter_value(parameter: service_pb2.InferParameter) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, kind) if kind else None


def _rest_response(
    response: service_pb2.ModelInferResponse, request: InferRequest
) -> tuple[bytes, dict[str, str]]:
    """The gRPC answer in the REST shape (JSON header, then the outputs asked for in binary)."""
    asked = {o.name: o.binary_data for o in request.outputs}
    header: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        header["id"] = response.id
    if response.parameters:
        header["parameters"] = {k: _parameter_value(v) for k, v in response.parameters.items()}
    outputs, blobs = [], []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        binary = asked.get(tensor.name)
        if binary is None:
            binary = bool(request.binary_data_output)
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if binary:
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _json_values(tensor.datatype, raw)
        outputs.append(entry)
    header["outputs"] = outputs
    encoded = json.dumps(header, separators=(",", ":")).encode()
    if not blobs:
        return encoded, {"Content-Type": "application/json"}
    return b"".join([encoded, *blobs]), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(encoded)),
    }


def _compress(body: bytes, headers: dict[str, str], accept_encoding: str) -> bytes:
    accepted = {part.split(";")[0].strip().lower() for part in accept_encoding.split(",")}
    if "gzip" in accepted:
        headers["Content-Encoding"] = "gzip"
        return gzip.compress(body, compresslevel=1)
    if "deflate" in accepted:
        headers["Content-Encoding"] = "deflate"
        return zlib.compress(body, 1)
    return body


class TritonGrpcBackend:
    """Triton over gRPC (``tritonclient``'s protobufs and stubs on ``grpc.aio`` channels).

    Args:
        url: ``host:port`` of Triton's gRPC endpoint.
        channels: channels (HTTP/2 connections) used in turn.
    """

    def __init__(self, url: str, channels: int = 4) -> None:
        self.url = url
        self._channels = [
            grpc.aio.insecure_channel(url, options=_CHANNEL_OPTIONS) for _ in range(channels)
        ]
        self._stubs = itertools.cycle(
            [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in self._channels]
        )

    async def _call(self, rpc: str, message: Message, timeout_s: float, model: str | None) -> Any:
        """``rpc`` (a method of Triton's gRPC service) on the next channel; errors translated for
        ``model``."""
        try:
            async with asyncio.timeout(timeout_s):
                return await getattr(next(self._stubs), rpc)(message, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise grpc_error(exc, model) from exc
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
        """Run ``model`` on ``inputs``; see :meth:`gateway.backends.triton.TritonHttpBackend.infer`."""
        from gateway.protocol.kserve import RequestedOutput

        request = InferRequest(
            inputs=tuple(InputTensor.from_numpy(t.name, t.data) for t in inputs),
            outputs=tuple(RequestedOutput(name) for name in outputs or ()),
            timeout_us=timeout_us(timeout_s),
            priority=priority or None,
        )
        message = _protobuf_request(model, version, request)
        response = await self._call("ModelInfer", message, timeout_s, model)
        out = {}
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=False):
            out[tensor.name] = InputTensor(
                tensor.name, tensor.datatype, tuple(tensor.shape), raw
            ).as_numpy()
        return out

    async def infer_v2(
        self,
        model: str,
        request: InferRequest,
        *,
        timeout_s: float,
        version: str = "",
        accept_encoding: str = "identity",
    ) -> RawResponse:
        """Send a checked KServe v2 request over gRPC; the answer comes back in the REST shape."""
        message = _protobuf_request(model, version, request)
        response = await self._call("ModelInfer", message, timeout_s, model)
        body, headers = _rest_response(response, request)
        return RawResponse(_compress(body, headers, accept_encoding), headers)

    async def model_metadata(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]:
        """Triton's KServe v2 metadata of ``model``, shaped as the HTTP endpoint gives it."""
        message = service_pb2.ModelMetadataRequest(name=model, version=version)
        response = await self._call("ModelMetadata", message, timeout_s, model)
        return {
            "name": response.name,
            "versions": list(response.versions),
            "platform": response.platform,
            "inputs": [_tensor_metadata(t) for t in response.inputs],
            "outputs": [_tensor_metadata(t) for t in response.outputs],
        }

    async def model_config(
        self, model: str, *, timeout_s: float, version: str = ""
    ) -> dict[str, Any]:
        """Triton's configuration of ``model`` as JSON (protobuf field names, as over HTTP)."""
        message = service_pb2.ModelConfigRequest(name=model, version=version)
        response = await self._call("ModelConfig", message, timeout_s, model)
        return _as_json(response.config)

    async def model_ready(self, model: str, *, timeout_s: float, version: str = "") -> bool:
        message = service_pb2.ModelReadyRequest(name=model, version=version)
        response = await self._call("ModelReady", message, timeout_s, model)
        return bool(response.ready)

    async def server_metadata(self, *, timeout_s: float) -> dict[str, Any]:
        message = service_pb2.ServerMetadataRequest()
        response = await self._call("ServerMetadata", message, timeout_s, None)
        return {
            "name": response.name,
            "version": response.version,
            "extensions": list(response.extensions),
        }

    async def server_ready(self, *, timeout_s: float) -> bool:
        """Whether Triton says it is ready; ``False`` (never an error) when it cannot be reached."""
        try:
            message = service_pb2.ServerReadyRequest()
            response = await self._call("ServerReady", message, timeout_s, None)
        except GatewayError:  # a probe: unreachable, slow or broken all mean "not ready"
            return False
        return bool(response.ready)

    async def repository_index(self, *, timeout_s: float) -> list[dict[str, Any]]:
        message = service_pb2.RepositoryIndexRequest()
        response = await self._call("RepositoryIndex", message, timeout_s, None)
        return [_as_json(m, defaults=False) for m in response.models]

    async def reload_model(self, model: str, *, timeout_s: float) -> None:
        config = reload_config(await self.model_config(model, timeout_s=timeout_s))
        message = service_pb2.RepositoryModelLoadRequest(model_name=model)
        message.parameters["config"].string_param = config
        await self._call("RepositoryModelLoad", message, timeout_s, model)

    async def statistics(
        self, *, timeout_s: float, model: str = "", version: str = ""
    ) -> list[dict[str, Any]]:
        """Triton's statistics extension for every loaded model, or for ``model`` (its ``version``, when
        given); counters as integers, as over HTTP."""
        message = service_pb2.ModelStatisticsRequest(name=model, version=version)
        response = await self._call("ModelStatistics", message, timeout_s, model or None)
        return [_as_json(m) for m in response.model_stats]

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))


def _tensor_metadata(tensor: service_pb2.ModelMetadataResponse.TensorMetadata) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": [int(d) for d in tensor.shape],
    }


def _as_json(message: Message, defaults: bool = True) -> dict[str, Any]:
    """A protobuf as the JSON Triton's HTTP endpoint writes: field names as declared, fields at their
    default value included where it includes them, 64-bit integers as numbers (protobuf's JSON
    mapping makes them strings)."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=defaults
    )
    _int64_numbers(message.DESCRIPTOR, doc)
    return doc


_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _int64_numbers(descriptor: Descriptor, doc: dict[str, Any]) -> None:
    for name, value in doc.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        message_type = field.message_type
        if message_type is not None and message_type.GetOptions().map_entry:
            entry = message_type.fields_by_name["value"]
            if entry.message_type is not None:
                for item in value.values():
                    _int64_numbers(entry.message_type, item)
            elif entry.type in _INT64:
                doc[name] = {k: int(v) for k, v in value.items()}
        elif message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                _int64_numbers(message_type, item)
        elif field.type in _INT64:
            doc[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
