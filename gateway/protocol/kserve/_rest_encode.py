"""A parsed KServe v2 request encoded for Triton's REST binary tensor extension: a canonical JSON
header (ASCII, no duplicate keys, no data) followed by every input in binary, so Triton never sees
the client's bytes."""

from __future__ import annotations

import json
from typing import Any

from gateway.protocol.kserve._rest import HEADER_LENGTH
from gateway.protocol.kserve._types import InferRequest, RequestedOutput

__all__ = ["encode_rest"]


def encode_rest(request: InferRequest) -> tuple[bytes, dict[str, str]]:
    """The request as Triton's REST binary extension: canonical JSON header, then every input's bytes.

    Returns:
        ``(body, headers)``; the headers are ``Content-Type`` and ``Inference-Header-Content-Length``.
    """
    raws = [tensor.raw() for tensor in request.inputs]
    header: dict[str, Any] = {}
    if request.id:
        header["id"] = request.id
    parameters: dict[str, Any] = dict(request.parameters)
    if request.binary_data_output is not None:
        parameters["binary_data_output"] = request.binary_data_output
    if request.timeout_us is not None:
        parameters["timeout"] = request.timeout_us
    if request.priority is not None:
        parameters["priority"] = request.priority
    if parameters:
        header["parameters"] = parameters
    header["inputs"] = [
        {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
            "parameters": {"binary_data_size": len(raw)},
        }
        for tensor, raw in zip(request.inputs, raws, strict=True)
    ]
    if request.outputs:
        header["outputs"] = [_encode_output(output) for output in request.outputs]
    encoded = json.dumps(header, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode(
        "ascii"
    )
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(encoded))}
    return b"".join([encoded, *raws]), headers


def _encode_output(output: RequestedOutput) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": output.name}
    parameters: dict[str, Any] = {}
    if output.binary_data is not None:
        parameters["binary_data"] = output.binary_data
    if output.class_count:
        parameters["classification"] = output.class_count
    if parameters:
        entry["parameters"] = parameters
    return entry
