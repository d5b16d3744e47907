"""KServe v2 over REST: parse a request body strictly into an :class:`InferRequest`, and encode one back.

A body is either JSON, or (the binary tensor extension) a JSON header of
``Inference-Header-Content-Length`` bytes followed by the inputs that declare
``parameters.binary_data_size``, in input order. Every declared size must match the bytes that
follow and the element count of the input's shape and datatype; JSON ``data`` must hold exactly
that many elements of the datatype's kind. Anything else is a :class:`~gateway.errors.BadRequest`
naming the field.

What is sent on is :func:`gateway.protocol.kserve._rest_encode.encode_rest` of the parsed request: a
canonical JSON header (ASCII, no duplicate keys, no data) and every input in binary. Triton never
sees the client's bytes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import TRITON_RESERVED_REQUEST_PARAMS, TRITON_RESERVED_REQUEST_PARAMS_PREFIX

from gateway.protocol.kserve import _strict_json
from gateway.protocol.kserve._tensor_data import _bad, _binary_data, _json_data
from gateway.protocol.kserve._types import (
    BYTES_ELEMENT_WORK,
    DATATYPES,
    NUMERIC_BINARY_DISCOUNT,
    InferRequest,
    InputTensor,
    ParameterValue,
    RequestedOutput,
)

__all__ = [
    "DEFAULT_MAX_DIMS",
    "DEFAULT_MAX_JSON_DEPTH",
    "DEFAULT_MAX_TENSORS",
    "HEADER_LENGTH",
    "ParseLimits",
    "parse_rest",
]

#: the binary tensor extension's header: bytes of JSON at the start of the body
HEADER_LENGTH = "Inference-Header-Content-Length"
DEFAULT_MAX_JSON_DEPTH = 24
DEFAULT_MAX_TENSORS = 64
DEFAULT_MAX_DIMS = 16
DEFAULT_MAX_NAME_CHARS = 256
DEFAULT_MAX_PARAMETERS = 32
DEFAULT_MAX_TEXT_CHARS = 1024
DEFAULT_MAX_CLASS_COUNT = 1000
_MAX_DIM = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
# ``model_name``: KServe's Python client (``InferRequest.to_rest``) names the model in the body too.
_REQUEST_KEYS = frozenset({"id", "model_name", "parameters", "inputs", "outputs"})
_INPUT_KEYS = frozenset({"name", "shape", "datatype", "parameters", "data"})
_OUTPUT_KEYS = frozenset({"name", "parameters"})


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on a request's structure (sizes are bounded by the body cap and the shapes).

    Args:
        max_depth: most levels of nested JSON arrays/objects.
        max_tensors: most inputs, and most outputs, per request.
        max_dims: most dimensions per shape.
        max_name_chars: longest input/output/parameter name.
        max_parameters: most custom request parameters.
        max_text_chars: longest request id or string parameter.
        max_class_count: largest ``classification`` top-k.
    """

    max_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_tensors: int = DEFAULT_MAX_TENSORS
    max_dims: int = DEFAULT_MAX_DIMS
    max_name_chars: int = DEFAULT_MAX_NAME_CHARS
    max_parameters: int = DEFAULT_MAX_PARAMETERS
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_class_count: int = DEFAULT_MAX_CLASS_COUNT


def _object(value: Any, allowed: frozenset[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{where} must be a JSON object", where)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _bad(
            f"{where} has an unknown field {unknown[0]!r} (known: {', '.join(sorted(allowed))})",
            where,
        )
    return value


def _name(value: Any, where: str, limits: ParseLimits) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(f"{where} must be a non-empty string", where)
    if len(value) > limits.max_name_chars or _CONTROL.search(value):
        raise _bad(f"{where} must be at most {limits.max_name_chars} printable characters", where)
    return value


_TWICE = {"inputs": "input '{}' is given twice", "outputs": "output '{}' is asked for twice"}


def _tensor_entry(
    value: Any, allowed: frozenset[str], where: str, limits: ParseLimits, taken: Iterable[str]
) -> tuple[dict[str, Any], str]:
    """An entry of ``inputs`` or ``outputs`` at ``where`` ("inputs.2") and its name, refused when
    the name is ``taken`` already."""
    item = _object(value, allowed, where)
    name = _name(item.get("name"), f"{where}.name", limits)
    if name in taken:
        raise _bad(_TWICE[where.partition(".")[0]].format(name), f"{where}.name")
    return item, name


def _int(value: Any, where: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _bad(f"{where} must be an integer between {low} and {high}", where)
    return value


def _parse_parameters(
    value: Any, limits: ParseLimits
) -> tuple[dict[str, ParameterValue], dict[str, Any]]:
    """Custom parameters, and the reserved ones the gateway accepts from a client."""
    if value is None:
        return {}, {}
    if not isinstance(value, dict):
        raise _bad("parameters must be a JSON object", "parameters")
    if len(value) > limits.max_parameters:
        raise _bad(
            f"parameters holds {len(value)} entries; at most {limits.max_parameters}", "parameters"
        )
    custom: dict[str, ParameterValue] = {}
    reserved: dict[str, Any] = {}
    for key, item in value.items():
        where = f"parameters.{key}"
        _name(key, "parameters (a key)", limits)
        if key == "binary_data_output":
            if not isinstance(item, bool):
                raise _bad(f"{where} must be true or false", where)
            reserved[key] = item
        elif key == "timeout":
            reserved[key] = _int(item, where, 0, _INT64[1])
        elif key == "priority":
            raise _bad(
                f"{where}: the request priority is set by the gateway from the credential's tier",
                where,
            )
        elif key.startswith("sequence_"):
            raise _bad(
                f"{where}: sequence requests (sequence_id/start/end) are not served through the gateway",
                where,
            )
        elif key.startswith("shared_memory_"):
            # Not in tritonclient's reserved list, yet Triton reads it: a custom parameter it would be
            # forwarded as. Named by prefix, so a spelling Triton adds later is refused too.
            raise _bad(
                f"{where}: shared memory regions cannot be used through the gateway; send the data",
                where,
            )
        elif key in TRITON_RESERVED_REQUEST_PARAMS or key.startswith(
            TRITON_RESERVED_REQUEST_PARAMS_PREFIX
        ):
            raise _bad(f"parameter {key!r} is reserved by Triton", where)
        elif isinstance(item, bool):
            custom[key] = item
        elif isinstance(item, int):
            custom[key] = _int(item, where, *_INT64)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _bad(f"{where} must be a finite number", where)
            custom[key] = item
        elif isinstance(item, str):
            if len(item) > limits.max_text_chars:
                raise _bad(f"{where} is longer than {limits.max_text_chars} characters", where)
            custom[key] = item
        else:
            raise _bad(f"{where} must be a string, number or boolean", where)
    return custom, reserved


def _tensor_parameters(value: Any, where: str, allowed: frozenset[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{where} must be a JSON object", where)
    for key in value:
        if key in _SHARED_MEMORY or str(key).startswith("shared_memory_"):
            raise _bad(
                f"{where}.{key}: shared memory regions cannot be used through the gateway; send the data",
                f"{where}.{key}",
            )
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise _bad(
                f"{where} has an unknown parameter {key!r} (known: {known})", f"{where}.{key}"
            )
    return value


def _shape(value: Any, where: str, limits: ParseLimits) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > limits.max_dims:
        raise _bad(f"{where} must be a list of at most {limits.max_dims} dimensions", where)
    for dim in value:
        if type(dim) is not int or not 0 <= dim <= _MAX_DIM:
            raise _bad(f"{where} must hold integers between 0 and {_MAX_DIM}", where)
    return tuple(value)


def _split_point(value: str | None, body_length: int) -> int | None:
    text = (value or "").strip()
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= body_length:
        return None
    return int(text)


#: the most JSON header :func:`work_bytes` reads to weigh a binary body (a larger one weighs whole)
_WEIGHED_HEADER_BYTES = 8 * 1024


def work_bytes(body: bytes, header_length: str | None) -> int:
    """What :func:`parse_rest` of this body costs, in bytes of JSON, without doing it.

    JSON counts whole. Binary data is weighed by its JSON header (read here with the standard
    parser when it is small; the strict parse comes later): each BYTES element it declares costs
    Python work (:data:`BYTES_ELEMENT_WORK`), numeric data only a copy
    (:data:`NUMERIC_BINARY_DISCOUNT` times less a byte). A header that cannot be read so cheaply
    weighs the whole body.
    """
    split = _split_point(header_length, len(body))
    if split is None or split > _WEIGHED_HEADER_BYTES:
        return len(body)
    tail = len(body) - split
    try:
        inputs = json.loads(body[:split]).get("inputs")
        # No dimension below 0 (a negative one must not cancel another input's elements); at most
        # one element per 4 bytes (each carries a 4-byte length).
        declared = sum(
            math.prod(max(0, int(d)) for d in item["shape"])
            for item in inputs
            if item.get("datatype") == "BYTES"
        )
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return len(body)
    return split + min(declared, tail // 4) * BYTES_ELEMENT_WORK + tail // NUMERIC_BINARY_DISCOUNT


def _header_length(value: str | None, body_length: int) -> int | None:
    if value is None:
        return None
    split = _split_point(value, body_length)
    if split is None:
        raise _bad(
            f"{HEADER_LENGTH} must be a whole number of bytes between 1 and the body length ({body_length})",
            HEADER_LENGTH,
        )
    return split


def parse_rest(
    body: bytes, header_length: str | None = None, limits: ParseLimits | None = None
) -> InferRequest:
    """Parse and check a KServe v2 REST inference body.

    Args:
        body: the (decompressed) request body.
        header_length: the ``Inference-Header-Content-Length`` header, if the client sent one.
        limits: structural bounds (defaults otherwise).

    Returns:
        The checked request.

    Raises:
        BadRequest: anything malformed, with the field named.
    """
    limits = limits or ParseLimits()
    split = _header_length(header_length, len(body))
    header, tail = (body, b"") if split is None else (body[:split], body[split:])
    what = "body" if split is None else "JSON header"
    document = _object(
        _strict_json.loads(header, max_depth=limits.max_depth, what=what), _REQUEST_KEYS, what
    )

    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not 1 <= len(raw_inputs) <= limits.max_tensors:
        raise _bad(f"inputs must be a list of 1 to {limits.max_tensors} tensors", "inputs")
    inputs: list[InputTensor] = []
    offset = 0
    for index, item in enumerate(raw_inputs):
        where = f"inputs.{index}"
        item, name = _tensor_entry(item, _INPUT_KEYS, where, limits, (t.name for t in inputs))
        datatype = item.get("datatype")
        if datatype not in DATATYPES:
            raise _bad(
                f"input '{name}': datatype must be one of {', '.join(DATATYPES)}",
                f"{where}.datatype",
            )
        shape = _shape(item.get("shape"), f"{where}.shape", limits)
        params = _tensor_parameters(
            item.get("parameters"), f"{where}.parameters", frozenset({"binary_data_size"})
        )
        if "binary_data_size" in params:
            if "data" in item:
                raise _bad(f"input '{name}' has both data and binary_data_size", f"{where}.data")
            size = _int(
                params["binary_data_size"], f"{where}.parameters.binary_data_size", 0, _INT64[1]
            )
            if offset + size > len(tail):
                raise _bad(
                    f"input '{name}': binary_data_size {size} runs past the {len(tail)} bytes after the "
                    f"JSON header"
                    + ("" if split is not None else f" (no {HEADER_LENGTH} header was sent)"),
                    f"{where}.parameters.binary_data_size",
                )
            data: np.ndarray | bytes = _binary_data(
                tail[offset : offset + size], name, datatype, shape, where
            )
            offset += size
        elif "data" in item:
            data = _json_data(item["data"], name, datatype, shape, f"{where}.data")
        else:
            raise _bad(f"input '{name}' has neither data nor binary_data_size", f"{where}.data")
        inputs.append(InputTensor(name=name, datatype=datatype, shape=shape, data=data))
    if offset != len(tail):
        raise _bad(
            f"{len(tail)} bytes follow the JSON header but the inputs' binary_data_size add up to {offset}",
            HEADER_LENGTH,
        )

    outputs = _parse_outputs(document.get("outputs"), limits)
    custom, reserved = _parse_parameters(document.get("parameters"), limits)
    request_id = document.get("id", "")
    if (
        not isinstance(request_id, str)
        or len(request_id) > limits.max_text_chars
        or _CONTROL.search(request_id)
    ):
        raise _bad(
            f"id must be a string of at most {limits.max_text_chars} printable characters", "id"
        )
    model_name = (
        _name(document["model_name"], "model_name", limits) if "model_name" in document else ""
    )
    return InferRequest(
        inputs=tuple(inputs),
        outputs=outputs,
        id=request_id,
        parameters=custom,
        binary_data_output=reserved.get("binary_data_output"),
        timeout_us=reserved.get("timeout"),
        model_name=model_name,
    )


def _parse_outputs(value: Any, limits: ParseLimits) -> tuple[RequestedOutput, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limits.max_tensors:
        raise _bad(f"outputs must be a list of at most {limits.max_tensors} entries", "outputs")
    outputs: list[RequestedOutput] = []
    for index, item in enumerate(value):
        where = f"outputs.{index}"
        item, name = _tensor_entry(item, _OUTPUT_KEYS, where, limits, (o.name for o in outputs))
        params = _tensor_parameters(
            item.get("parameters"),
            f"{where}.parameters",
            frozenset({"binary_data", "classification"}),
        )
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise _bad(
                f"output '{name}': binary_data must be true or false",
                f"{where}.parameters.binary_data",
            )
        classes = params.get("classification", 0)
        _int(classes, f"{where}.parameters.classification", 0, limits.max_class_count)
        outputs.append(RequestedOutput(name=name, binary_data=binary, class_count=classes))
    return tuple(outputs)
