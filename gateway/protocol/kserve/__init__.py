"""KServe v2 inference requests, checked once and encoded for Triton by the gateway.

Every entry (REST now, gRPC beside it) decodes a client's request into one protocol-neutral
:class:`InferRequest`; every transport to Triton encodes that object, never the client's bytes.
The REST decoder is strict (see :mod:`gateway.protocol.kserve._rest` and
:mod:`gateway.protocol.kserve._strict_json`): what the gateway checked is exactly what Triton runs.

Public API::

    parse_rest(body, header_length, limits) -> InferRequest     # REST JSON / binary extension
    parse_grpc(message, limits) -> InferRequest                 # gRPC ModelInferRequest, same checks
    response_from_rest(body, headers) -> ModelInferResponse     # Triton's REST answer, for gRPC
    encode_rest(request) -> (body, headers)                     # to Triton over REST
    RestBody(body, header_length).parse(limits)                 # a received body, parsed later
    GrpcBody(message).parse(limits)                             # a received gRPC request, parsed later
    ParsePool(workers).parse(body, header_length, limits)       # parse_rest in a worker process
    InferRequest, InputTensor, RequestedOutput, ParseLimits, DATATYPES, element_size
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.protocol.kserve._grpc import GrpcBody, parse_grpc, response_from_rest
from gateway.protocol.kserve._parse_pool import ParsePool
from gateway.protocol.kserve._rest import (
    DEFAULT_MAX_DIMS,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_TENSORS,
    HEADER_LENGTH,
    ParseLimits,
    parse_rest,
)
from gateway.protocol.kserve._rest import work_bytes as _work_bytes
from gateway.protocol.kserve._rest_encode import encode_rest
from gateway.protocol.kserve._types import (
    DATATYPES,
    InferRequest,
    InputTensor,
    ParameterValue,
    RequestedOutput,
    element_size,
)

__all__ = [
    "DATATYPES",
    "DEFAULT_MAX_DIMS",
    "DEFAULT_MAX_JSON_DEPTH",
    "DEFAULT_MAX_TENSORS",
    "GrpcBody",
    "HEADER_LENGTH",
    "InferRequest",
    "InputTensor",
    "ParameterValue",
    "ParseLimits",
    "ParsePool",
    "RequestedOutput",
    "RestBody",
    "element_size",
    "encode_rest",
    "parse_grpc",
    "parse_rest",
    "response_from_rest",
]


@dataclass(frozen=True)
class RestBody:
    """A REST inference body as received (already decompressed), not yet checked.

    The service parses it after admission, so a refused caller costs no parsing.

    Args:
        body: the request body.
        header_length: the ``Inference-Header-Content-Length`` header, if sent.
    """

    body: bytes
    header_length: str | None = None

    @property
    def work_bytes(self) -> int:
        """What checking it costs, in bytes of JSON (what decides whether that moves off the event
        loop): :func:`gateway.protocol.kserve._rest.work_bytes`."""
        return _work_bytes(self.body, self.header_length)

    def parse(self, limits: ParseLimits | None = None) -> InferRequest:
        """:func:`parse_rest` of this body."""
        return parse_rest(self.body, self.header_length, limits)
