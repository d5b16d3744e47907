"""Hostile inputs for the gateway's KServe v2 gRPC entry (``inference.GRPCInferenceService``).

The same lies as over REST, in protobuf: raw contents that disagree with the shape, huge declared
shapes, BYTES layouts that run past their end, typed contents out of their datatype's range,
shared memory, client-chosen priorities, made-up and reserved model names, and the calls the
gateway does not serve (repository control, shared memory). gRPC answers carry a status code, not
an HTTP status: the suite reads them through the gateway's own table (``GRPC_STATUS``), and
UNIMPLEMENTED (a call the gateway does not serve) as 405.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from tests.support.hostile_corpus import GrpcAttempt, Hostile

__all__ = ["grpc_cases"]


def _infer(
    model: str,
    *inputs: pb.ModelInferRequest.InferInputTensor,
    raw: list[bytes] | None = None,
    parameters: dict[str, pb.InferParameter] | None = None,
) -> Callable[[], pb.ModelInferRequest]:
    def build() -> pb.ModelInferRequest:
        request = pb.ModelInferRequest(
            model_name=model, inputs=list(inputs), raw_input_contents=raw or []
        )
        for key, value in (parameters or {}).items():
            request.parameters[key].CopyFrom(value)
        return request

    return build


def _tensor(
    name: str, datatype: str, shape: list[int], **fields: Any
) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if "contents" in fields:
        tensor.contents.CopyFrom(fields.pop("contents"))
    for key, value in fields.pop("parameters", {}).items():
        tensor.parameters[key].CopyFrom(value)
    return tensor


TENANCY_NAMES = "tenancy: model names checked before anything else (an empty one is named as such)"


def _case(label: str, attempt: GrpcAttempt, expect: tuple[int, ...], *mentions: str) -> Hostile:
    owner = TENANCY_NAMES if label == "model-empty" else None
    return Hostile(f"grpc-entry/{label}", "grpc-entry", attempt, frozenset(expect), mentions, owner)


def grpc_cases() -> Iterator[Hostile]:
    """Every gRPC hostile case."""
    pixels = [1, 3, 224, 224]
    fp32 = 4 * 3 * 224 * 224
    text = struct.pack("<I", 5) + b"hello"
    infer = "ModelInfer"
    cases: list[tuple[str, Callable[[], Any], tuple[int, ...], tuple[str, ...]]] = [
        (
            "raw-too-short",
            _infer("efficientnet_lite0", _tensor("input", "FP32", pixels), raw=[b"\0" * 10]),
            (400,),
            ("needs", "bytes"),
        ),
        (
            "raw-too-long",
            _infer(
                "efficientnet_lite0", _tensor("input", "FP32", pixels), raw=[b"\0" * (fp32 + 4)]
            ),
            (400,),
            ("needs", "bytes"),
        ),
        (
            "shape-2^40",
            _infer("efficientnet_lite0", _tensor("input", "FP32", [2**40]), raw=[b"\0" * 4]),
            (400,),
            ("shape",),
        ),
        (
            "shape-int64-max",
            _infer("efficientnet_lite0", _tensor("input", "FP32", [2**63 - 1]), raw=[b"\0" * 4]),
            (400,),
            ("shape",),
        ),
        (
            "shape-negative",
            _infer(
                "efficientnet_lite0",
                _tensor("input", "FP32", [-1, 3, 224, 224]),
                raw=[b"\0" * fp32],
            ),
            (400,),
            ("shape",),
        ),
        (
            "raw-count-mismatch",
            _infer("text_embedding", _tensor("TEXT", "BYTES", [1, 1]), raw=[text, text]),
            (400,),
            ("raw_input_contents", "inputs"),
        ),
        (
            "bytes-length-past-end",
            _infer(
                "text_embedding",
                _tensor("TEXT", "BYTES", [1, 1]),
                raw=[struct.pack("<I", 2**32 - 1) + b"hello"],
            ),
            (400,),
            ("BYTES",),
        ),
        (
            "bytes-two-for-one",
            _infer("text_embedding", _tensor("TEXT", "BYTES", [1, 1]), raw=[text + text]),
            (400,),
            ("BYTES",),
        ),
        (
            "typed-int8-300",
            _infer(
                "efficientnet_lite0",
                _tensor("input", "INT8", [1], contents=pb.InferTensorContents(int_contents=[300])),
            ),
            (400,),
            ("INT8", "range"),
        ),
        (
            "typed-count-mismatch",
            _infer(
                "efficientnet_lite0",
                _tensor(
                    "input", "FP32", pixels, contents=pb.InferTensorContents(fp32_contents=[1.0])
                ),
            ),
            (400,),
            ("elements", "needs", "data"),
        ),
        (
            "typed-and-raw",
            _infer(
                "text_embedding",
                _tensor(
                    "TEXT", "BYTES", [1, 1], contents=pb.InferTensorContents(bytes_contents=[b"x"])
                ),
                raw=[text],
            ),
            (400,),
            ("contents", "raw"),
        ),
        (
            "datatype-unknown",
            _infer("efficientnet_lite0", _tensor("input", "FLOAT32", [1]), raw=[b"\0" * 4]),
            (400,),
            ("datatype",),
        ),
        ("no-inputs", _infer("efficientnet_lite0"), (400,), ("inputs",)),
        (
            "name-nul",
            _infer("text_embedding", _tensor("TEXT\0", "BYTES", [1, 1]), raw=[text]),
            (400,),
            ("name",),
        ),
        (
            "shared-memory",
            _infer(
                "text_embedding",
                _tensor(
                    "TEXT",
                    "BYTES",
                    [1, 1],
                    parameters={"shared_memory_region": pb.InferParameter(string_param="r")},
                ),
            ),
            (400,),
            ("shared memory",),
        ),
        (
            "priority",
            _infer(
                "text_embedding",
                _tensor("TEXT", "BYTES", [1, 1]),
                raw=[text],
                parameters={"priority": pb.InferParameter(int64_param=1)},
            ),
            (400,),
            ("priority",),
        ),
        (
            "sequence",
            _infer(
                "text_embedding",
                _tensor("TEXT", "BYTES", [1, 1]),
                raw=[text],
                parameters={"sequence_id": pb.InferParameter(int64_param=7)},
            ),
            (400,),
            ("sequence",),
        ),
        (
            "model-unknown",
            _infer("made_up_model_grpc", _tensor("TEXT", "BYTES", [1, 1]), raw=[text]),
            (404,),
            ("made_up_model_grpc",),
        ),
        (
            "model-empty",
            _infer("", _tensor("TEXT", "BYTES", [1, 1]), raw=[text]),
            (400, 404),
            ("model",),
        ),
        (
            "message-over-cap",
            _infer(
                "efficientnet_lite0",
                _tensor("input", "FP32", [8, 3, 224, 224]),
                raw=[b"\0" * (8 * fp32)],
            ),
            (400, 413),
            (),
        ),
    ]
    for label, request, expect, mentions in cases:
        yield _case(label, GrpcAttempt(infer, request), expect, *mentions)
    for method, message in (
        (
            "RepositoryModelUnload",
            lambda: pb.RepositoryModelUnloadRequest(model_name="efficientnet_lite0"),
        ),
        (
            "RepositoryModelLoad",
            lambda: pb.RepositoryModelLoadRequest(model_name="efficientnet_lite0"),
        ),
        (
            "SystemSharedMemoryRegister",
            lambda: pb.SystemSharedMemoryRegisterRequest(name="r", key="/k", byte_size=1 << 40),
        ),
        (
            "CudaSharedMemoryRegister",
            lambda: pb.CudaSharedMemoryRegisterRequest(name="r", byte_size=1 << 40),
        ),
        ("TraceSetting", lambda: pb.TraceSettingRequest()),
        ("LogSettings", lambda: pb.LogSettingsRequest()),
    ):
        yield _case(
            f"not-served-{method}",
            GrpcAttempt(method, message),
            (405,),
            "gateway",
            "shared memory",
            "operator",
        )
    # Triton's statistics are an operator's read: an API key is refused, naming the admin credential.
    yield _case(
        "statistics-with-a-key",
        GrpcAttempt("ModelStatistics", lambda: pb.ModelStatisticsRequest(name="")),
        (403,),
        "admin credential",
    )
    yield _case(
        "no-credential",
        GrpcAttempt(
            infer,
            _infer("text_embedding", _tensor("TEXT", "BYTES", [1, 1]), raw=[text]),
            credential="none",
        ),
        (401,),
        "credential",
        "authorization",
    )
