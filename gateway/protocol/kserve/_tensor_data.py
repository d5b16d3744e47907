"""KServe v2 REST input data, checked against the input's datatype and shape: JSON ``data`` (exactly
the shape's element count, each of the datatype's kind and range) and binary tensor data (exactly the
bytes the shape and datatype need; BYTES as length-prefixed elements). Anything else is a
:class:`~gateway.errors.BadRequest` naming the field. Used by :mod:`gateway.protocol.kserve._rest` and
:mod:`gateway.protocol.kserve._grpc`.
"""

from __future__ import annotations

import math
import struct
from itertools import chain
from typing import Any

import numpy as np

from gateway.errors import BadRequest
from gateway.protocol.kserve import _strict_json
from gateway.protocol.kserve._types import element_size, numpy_dtype


def _bad(detail: str, field: str) -> BadRequest:
    return BadRequest(detail, field=field)


def _flatten(data: Any, where: str) -> list[Any]:
    """Row-major leaves of ``data`` (a flat list or regularly nested lists); one C-speed pass per level."""
    if not isinstance(data, list):
        raise _bad(f"{where} must be a JSON array", where)
    while data:
        kinds = set(map(type, data))
        if list not in kinds:
            return data
        if kinds != {list}:
            raise _bad(f"{where} mixes arrays and values at one nesting level", where)
        data = list(chain.from_iterable(data))
    return data


def _json_data(
    data: Any, name: str, datatype: str, shape: tuple[int, ...], where: str
) -> np.ndarray:
    flat = _flatten(data, where)
    count = math.prod(shape)
    if len(flat) != count:
        raise _bad(
            f"input '{name}' has {len(flat)} data elements; shape {list(shape)} needs {count}",
            where,
        )
    if datatype == "BF16":
        raise _bad(f"input '{name}': BF16 data must be sent in binary (binary_data_size)", where)
    kinds = set(map(type, flat))
    dtype = numpy_dtype(datatype)
    if datatype == "BYTES":
        if kinds - {str}:
            raise _bad(f"input '{name}': BYTES data must be JSON strings", where)
        try:
            values = [item.encode("utf-8") for item in flat]
        except UnicodeEncodeError:
            index = next(i for i, item in enumerate(flat) if _strict_json.has_surrogate(item))
            raise _bad(
                f"input '{name}' item {index} holds a lone UTF-16 surrogate (not Unicode text)",
                where,
            ) from None
        array = np.empty(count, dtype=np.object_)
        array[:] = values
        return array.reshape(shape)
    if datatype == "BOOL":
        if kinds - {bool}:
            raise _bad(f"input '{name}': BOOL data must be true or false", where)
        return np.array(flat, dtype=dtype).reshape(shape)
    if dtype.kind in "iu":
        if kinds - {int}:
            raise _bad(f"input '{name}': {datatype} data must be integers", where)
        info = np.iinfo(dtype)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise _bad(
                f"input '{name}': a value is outside the {datatype} range [{info.min}, {info.max}]",
                where,
            )
        return np.array(flat, dtype=dtype).reshape(shape)
    if kinds - {int, float}:
        raise _bad(f"input '{name}': {datatype} data must be numbers", where)
    try:
        wide = np.array(flat, dtype=np.float64)
    except OverflowError:
        raise _bad(f"input '{name}': a value is outside the {datatype} range", where) from None
    # No JSON number is infinite: an infinity here is a literal like 1e999 that overflowed.
    if wide.size and not float(np.abs(wide).max()) <= float(np.finfo(dtype).max):
        raise _bad(f"input '{name}': a value is outside the {datatype} range", where)
    return wide.astype(dtype).reshape(shape)


def _check_bytes_layout(raw: bytes, name: str, count: int, where: str) -> None:
    """BYTES in binary: exactly ``count`` length-prefixed elements filling ``raw``."""
    offset, seen, end = 0, 0, len(raw)
    while offset < end and seen <= count:
        if offset + 4 > end:
            break
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4 + length
        seen += 1
    if offset != end or seen != count:
        raise _bad(
            f"input '{name}': binary BYTES data does not hold exactly {count} length-prefixed elements "
            f"in its {end} bytes",
            where,
        )


def _binary_data(raw: bytes, name: str, datatype: str, shape: tuple[int, ...], where: str) -> bytes:
    count = math.prod(shape)
    size = element_size(datatype)
    if size is None:
        if count * 4 > len(raw):
            raise _bad(
                f"input '{name}': {len(raw)} bytes cannot hold {count} BYTES elements", where
            )
        _check_bytes_layout(raw, name, count, where)
    elif len(raw) != count * size:
        raise _bad(
            f"input '{name}': binary_data_size is {len(raw)} bytes; shape {list(shape)} of {datatype} "
            f"needs {count * size}",
            where,
        )
    return raw
