"""KServe v2 over gRPC: a ``ModelInferRequest`` checked into an :class:`InferRequest`, and Triton's
answer turned into a ``ModelInferResponse``.

The checks are the REST parser's own (:mod:`gateway.protocol.kserve._rest`): the same names, shapes,
datatypes, sizes, parameters and refusals, so a request the REST entry refuses is refused here with
the same message. What differs is only how data arrives: ``raw_input_contents`` (one entry per input,
Triton's binary layout, what tritonclient sends) or typed ``contents``, whose values are checked
against the datatype's range as JSON data is.

The request reaches Triton as every checked request does (:func:`encode_rest`), asking for every
output in binary, and :func:`response_from_rest` moves those bytes into ``raw_output_contents``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from gateway.errors import UpstreamError
from gateway.protocol.kserve._rest import (
    _CONTROL,
    _INT64,
    HEADER_LENGTH,
    ParseLimits,
    _name,
    _parse_outputs,
    _parse_parameters,
    _shape,
    _tensor_parameters,
)
from gateway.protocol.kserve._tensor_data import _bad, _binary_data
from gateway.protocol.kserve._types import (
    BYTES_ELEMENT_WORK,
    DATATYPES,
    NUMERIC_BINARY_DISCOUNT,
    InferRequest,
    InputTensor,
    numpy_dtype,
)

__all__ = ["GrpcBody", "infer_parameter", "parse_grpc", "response_from_rest"]

# Which InferTensorContents field carries each datatype (FP16 and BF16 travel raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _parameter_value(parameter: pb.InferParameter, where: str) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    if kind is None:
        raise _bad(f"{where} has no value", where)
    value = getattr(parameter, kind)
    if kind == "uint64_param" and value > _INT64[1]:
        raise _bad(f"{where} must be an integer between {_INT64[0]} and {_INT64[1]}", where)
    return value


def _parameters(parameters: Mapping[str, pb.InferParameter], where: str) -> dict[str, Any]:
    return {key: _parameter_value(value, f"{where}.{key}") for key, value in parameters.items()}


def _typed_contents(
    tensor: pb.ModelInferRequest.InferInputTensor, shape: tuple[int, ...], where: str
) -> np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise _bad(
            f"input '{name}': {datatype} data must be sent in raw_input_contents",
            f"{where}.contents",
        )
    others = [
        f for f in _CONTENTS_FIELD.values() if f != field and len(getattr(tensor.contents, f))
    ]
    if others:
        raise _bad(
            f"input '{name}': {datatype} data belongs in contents.{field}, not {others[0]}",
            f"{where}.contents",
        )
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise _bad(
            f"input '{name}' has {len(values)} data elements; shape {list(shape)} needs {count}",
            f"{where}.contents",
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    if dtype.kind in "iu" and count:
        info = np.iinfo(dtype)
        wide = np.asarray(values, dtype=np.int64 if dtype.kind == "i" else np.uint64)
        if int(wide.min()) < info.min or int(wide.max()) > info.max:
            raise _bad(
                f"input '{name}': a value is outside the {datatype} range [{info.min}, {info.max}]",
                f"{where}.contents",
            )
    return np.asarray(values, dtype=dtype).reshape(shape)


def parse_grpc(message: pb.ModelInferRequest, limits: ParseLimits | None = None) -> InferRequest:
    """Check a gRPC inference request and return it as an :class:`InferRequest`.

    Args:
        message: the request as the gRPC server decoded it.
        limits: structural bounds (defaults otherwise).

    Returns:
        The checked request; Triton is asked for every output in binary.

    Raises:
        BadRequest: anything malformed, with the field named.
    """
    limits = limits or ParseLimits()
    if not 1 <= len(message.inputs) <= limits.max_tensors:
        raise _bad(f"inputs must be a list of 1 to {limits.max_tensors} tensors", "inputs")
    raw_contents = message.raw_input_contents
    if raw_contents and len(raw_contents) != len(message.inputs):
        raise _bad(
            f"raw_input_contents holds {len(raw_contents)} entries for {len(message.inputs)} "
            "inputs; send one per input, or use contents",
            "raw_input_contents",
        )
    inputs: list[InputTensor] = []
    for index, tensor in enumerate(message.inputs):
        where = f"inputs.{index}"
        name = _name(tensor.name, f"{where}.name", limits)
        if any(t.name == name for t in inputs):
            raise _bad(f"input '{name}' is given twice", f"{where}.name")
        if tensor.datatype not in DATATYPES:
            raise _bad(
                f"input '{name}': datatype must be one of {', '.join(DATATYPES)}",
                f"{where}.datatype",
            )
        shape = _shape(list(tensor.shape), f"{where}.shape", limits)
        # KServe's Python client states each raw input's size, as REST's binary extension does.
        params = _tensor_parameters(
            _parameters(tensor.parameters, f"{where}.parameters"),
            f"{where}.parameters",
            frozenset({"binary_data_size"}) if raw_contents else frozenset(),
        )
        data: np.ndarray | bytes
        if raw_contents:
            if tensor.HasField("contents"):
                raise _bad(
                    f"input '{name}' has both contents and raw_input_contents", f"{where}.contents"
                )
            if "binary_data_size" in params and params["binary_data_size"] != len(
                raw_contents[index]
            ):
                raise _bad(
                    f"input '{name}': binary_data_size {params['binary_data_size']} is not the "
                    f"{len(raw_contents[index])} bytes of its raw_input_contents",
                    f"{where}.parameters.binary_data_size",
                )
            data = _binary_data(raw_contents[index], name, tensor.datatype, shape, where)
        else:
            data = _typed_contents(tensor, shape, where)
        inputs.append(InputTensor(name=name, datatype=tensor.datatype, shape=shape, data=data))

    outputs = _parse_outputs(
        [
            {"name": o.name, "parameters": _parameters(o.parameters, f"outputs.{i}.parameters")}
            for i, o in enumerate(message.outputs)
        ]
        or None,
        limits,
    )
    # binary_data is a REST choice; gRPC outputs are always raw bytes.
    outputs = tuple(replace(o, binary_data=None) for o in outputs)
    custom, reserved = _parse_parameters(
        _parameters(message.parameters, "parameters") or None, limits
    )
    reserved.pop("binary_data_output", None)
    if len(message.id) > limits.max_text_chars or _CONTROL.search(message.id):
        raise _bad(
            f"id must be a string of at most {limits.max_text_chars} printable characters", "id"
        )
    return InferRequest(
        inputs=tuple(inputs),
        outputs=outputs,
        id=message.id,
        parameters=custom,
        binary_data_output=True,
        timeout_us=reserved.get("timeout"),
    )


@dataclass(frozen=True)
class GrpcBody:
    """A gRPC inference request as received, not yet checked (the service checks it after admission).

    Args:
        message: the request.
        deadline_us: what is left of the client's gRPC deadline; it bounds the request's ``timeout``,
            so Triton drops work the client no longer waits for.
    """

    message: pb.ModelInferRequest
    deadline_us: int | None = None

    @property
    def work_bytes(self) -> int:
        """What checking it costs, in bytes of JSON (what decides whether that moves off the event loop).

        The message's typed fields (values checked one by one) count whole; raw data is weighed as
        a REST body's binary part is (:func:`gateway.protocol.kserve._rest.work_bytes`).
        """
        raw = self.message.raw_input_contents
        tensors = self.message.inputs
        weighed = 0
        for index, data in enumerate(raw):
            if index < len(tensors) and tensors[index].datatype == "BYTES":
                declared = math.prod(max(0, d) for d in tensors[index].shape)
                weighed += min(declared, len(data) // 4) * BYTES_ELEMENT_WORK
            weighed += len(data) // NUMERIC_BINARY_DISCOUNT
        return self.message.ByteSize() - sum(len(data) for data in raw) + weighed

    def parse(self, limits: ParseLimits | None = None) -> InferRequest:
        """:func:`parse_grpc` of this message, its ``timeout`` no longer than the client's deadline."""
        request = parse_grpc(self.message, limits)
        if self.deadline_us is None or (
            request.timeout_us is not None and request.timeout_us <= self.deadline_us
        ):
            return request
        return replace(request, timeout_us=self.deadline_us)


def infer_parameter(value: Any) -> pb.InferParameter:
    """``value`` (a bool, int, float or string) as an ``InferParameter`` of the matching kind."""
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def _output_bytes(output: dict[str, Any], tail: bytes, offset: int) -> tuple[bytes, int]:
    """The raw bytes of one output of Triton's REST answer, binary or (should Triton send it) JSON."""
    size = (output.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if offset + int(size) > len(tail):
            raise UpstreamError("Triton's answer is shorter than its outputs declare")
        return tail[offset : offset + int(size)], offset + int(size)
    tensor = InputTensor.from_numpy(
        output["name"],
        np.asarray(
            output.get("data", []),
            dtype=numpy_dtype(output["datatype"]) if output["datatype"] != "BYTES" else np.object_,
        ).reshape(output["shape"]),
        output["datatype"],
    )
    return tensor.raw(), offset


def response_from_rest(body: bytes, headers: Mapping[str, str]) -> pb.ModelInferResponse:
    """Triton's REST answer (JSON header, binary outputs) as a gRPC ``ModelInferResponse``.

    Raises:
        UpstreamError: Triton's answer is not a well-formed inference response.
    """
    length = next((v for k, v in headers.items() if k.lower() == HEADER_LENGTH.lower()), None)
    split = int(length) if length is not None and length.isdigit() else len(body)
    try:
        document = json.loads(body[:split])
    except ValueError as exc:
        raise UpstreamError("Triton's answer is not a KServe v2 inference response") from exc
    tail = body[split:]
    response = pb.ModelInferResponse(
        model_name=str(document.get("model_name", "")),
        model_version=str(document.get("model_version", "")),
        id=str(document.get("id", "")),
    )
    for key, value in (document.get("parameters") or {}).items():
        response.parameters[key].CopyFrom(infer_parameter(value))
    offset = 0
    for output in document.get("outputs", []):
        raw, offset = _output_bytes(output, tail, offset)
        tensor = response.outputs.add(
            name=output["name"], datatype=output["datatype"], shape=output["shape"]
        )
        for key, value in (output.get("parameters") or {}).items():
            if key != "binary_data_size":
                tensor.parameters[key].CopyFrom(infer_parameter(value))
        response.raw_output_contents.append(raw)
    return response
