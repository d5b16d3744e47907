"""The checked KServe v2 inference request: what the gateway forwards, whatever the wire.

REST (JSON or the binary tensor extension) and gRPC (``ModelInferRequest``) decode into the same
:class:`InferRequest`; each transport to Triton encodes it back. Tensor data is held either as a
numpy array (dtype from ``tritonclient.utils.triton_to_np_dtype``; ``object`` of ``bytes`` for
BYTES) or as raw little-endian bytes in Triton's binary layout (BYTES elements prefixed by a 4-byte
little-endian length), the layout of both the REST binary extension and gRPC
``raw_input_contents``. Either form converts to the other on demand.

Instances are only made by the parsers (or by code that builds requests itself): holding one means
its shapes, datatypes and data sizes agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import (
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    serialize_byte_tensor,
    triton_to_np_dtype,
)

__all__ = [
    "BYTES_ELEMENT_WORK",
    "DATATYPES",
    "NUMERIC_BINARY_DISCOUNT",
    "InferRequest",
    "InputTensor",
    "ParameterValue",
    "RequestedOutput",
    "element_size",
]

# What checking a request costs, in bytes of JSON (20-80 ns a byte, by content): a binary BYTES
# element costs 140-230 ns of Python work, a byte of numeric binary data a copy (about 0.1 ns).
# The REST and gRPC bodies weigh themselves with these (``work_bytes``) to decide whether checking
# stays on the event loop; ``python -m loadtest.parse_bench`` measures each.
#: bytes of JSON that checking one binary BYTES element costs as much as
BYTES_ELEMENT_WORK = 4
#: bytes of numeric binary data that cost as much to check as one byte of JSON
NUMERIC_BINARY_DISCOUNT = 512

#: Every tensor datatype Triton serves, from its own model-configuration schema (``TYPE_STRING`` is
#: ``BYTES`` on the wire); tritonclient maps each to its numpy dtype.
DATATYPES: tuple[str, ...] = tuple(
    "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")
    for name in model_config_pb2.DataType.keys()
    if name != "TYPE_INVALID"
)

ParameterValue = str | int | bool | float


def element_size(datatype: str) -> int | None:
    """Bytes per element of ``datatype`` in the binary layout; ``None`` for BYTES (variable).

    Raises:
        ValueError: not a datatype of the protocol.
    """
    if datatype not in DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r}")
    if datatype == "BYTES":
        return None
    return int(np.dtype(triton_to_np_dtype(datatype)).itemsize)


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype tritonclient uses for ``datatype`` (little-endian for the fixed-size ones)."""
    dtype = np.dtype(triton_to_np_dtype(datatype))
    return dtype if dtype.kind in "bOV" or dtype.itemsize == 1 else dtype.newbyteorder("<")


@dataclass(frozen=True, slots=True)
class InputTensor:
    """One input: name, Triton datatype, shape and data that agree with each other.

    Args:
        name: the model's input name.
        datatype: a Triton datatype (``DATATYPES``).
        shape: dimensions, batch axis included where the model batches.
        data: a numpy array of ``shape`` elements, or raw little-endian bytes in Triton's layout.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | bytes = field(repr=False)

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    def raw(self) -> bytes:
        """The data in Triton's binary layout (what the REST extension and gRPC carry)."""
        if isinstance(self.data, bytes):
            return self.data
        if self.datatype == "BYTES":
            if self.data.size == 0:
                return b""
            return bytes(serialize_byte_tensor(self.data).item())
        return np.ascontiguousarray(self.data, dtype=numpy_dtype(self.datatype)).tobytes()

    def as_numpy(self) -> np.ndarray:
        """The data as an array of ``shape`` (BYTES as ``object`` of ``bytes``)."""
        if isinstance(self.data, np.ndarray):
            return self.data.reshape(self.shape)
        if self.datatype == "BYTES":
            flat = (
                deserialize_bytes_tensor(self.data) if self.data else np.empty(0, dtype=np.object_)
            )
            return flat.reshape(self.shape)
        return np.frombuffer(self.data, dtype=numpy_dtype(self.datatype)).reshape(self.shape)

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray, datatype: str | None = None) -> InputTensor:
        """An input holding ``array`` (datatype from its dtype unless given: object/str -> BYTES)."""
        if datatype is None:
            datatype = (
                "BYTES"
                if array.dtype == np.object_ or array.dtype.kind in "SU"
                else np_to_triton_dtype(array.dtype)
            )
        if datatype == "BYTES" and array.dtype != np.object_:
            array = np.array(
                [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)],
                dtype=np.object_,
            ).reshape(array.shape)
        return cls(
            name=name, datatype=datatype, shape=tuple(int(d) for d in array.shape), data=array
        )


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for.

    Args:
        name: the model's output name.
        binary_data: ``True``/``False`` to choose the REST response encoding of this output;
            ``None`` leaves it to the request's ``binary_data_output`` (gRPC ignores it).
        class_count: top-k classification of this output instead of its values (0: off).
    """

    name: str
    binary_data: bool | None = None
    class_count: int = 0


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A checked KServe v2 inference request.

    Args:
        inputs: the input tensors, in the client's order.
        outputs: the outputs asked for; empty means every output.
        id: the client's request id, echoed by Triton.
        parameters: custom request parameters (never Triton's reserved ones).
        binary_data_output: REST only: every output in binary unless an output says otherwise.
        timeout_us: the client's own deadline for Triton, in microseconds (``None``: none given).
        priority: the Triton request priority (set by the gateway's policy, never by the client).
        model_name: the model a REST body names (KServe's Python client sends it; '' when absent):
            checked against the path's model, never sent on.
    """

    inputs: tuple[InputTensor, ...]
    outputs: tuple[RequestedOutput, ...] = ()
    id: str = ""
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)
    binary_data_output: bool | None = None
    timeout_us: int | None = None
    priority: int | None = None
    model_name: str = ""

    def input(self, name: str) -> InputTensor:
        """The input called ``name``.

        Raises:
            KeyError: no such input.
        """
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)
