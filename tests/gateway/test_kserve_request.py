"""Unit tests of the strict KServe v2 request parser, its encoder and the bounded decompressor.

Bodies come from tritonclient's own request builder where a real client's bytes matter, and are
written out by hand where a hostile client's do.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as http

from gateway.backends.triton import safe_message
from gateway.errors import BadRequest, PayloadTooLarge
from gateway.http.compression import BoundedDecoder
from gateway.protocol.kserve import (
    HEADER_LENGTH,
    GrpcBody,
    InferRequest,
    InputTensor,
    ParseLimits,
    RestBody,
    encode_rest,
    parse_rest,
)
from gateway.protocol.kserve._strict_json import nesting_depth

ALL_TYPES = {
    "BOOL": np.array([True, False, True]),
    "UINT8": np.array([0, 255, 7], dtype=np.uint8),
    "UINT16": np.array([0, 65535, 7], dtype=np.uint16),
    "UINT32": np.array([0, 2**32 - 1, 7], dtype=np.uint32),
    "UINT64": np.array([0, 2**64 - 1, 7], dtype=np.uint64),
    "INT8": np.array([-128, 127, 0], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1, 0], dtype=np.int16),
    "INT32": np.array([-(2**31), 2**31 - 1, 0], dtype=np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1, 0], dtype=np.int64),
    "FP16": np.array([0.5, -65504, 1e-3], dtype=np.float16),
    "FP32": np.array([0.5, -3.4e38, 1e-30], dtype=np.float32),
    "FP64": np.array([0.5, -1.7e308, 5e-324], dtype=np.float64),
    "BYTES": np.array([b"", "h\u00e9".encode(), b"\x00\xff"], dtype=np.object_),
}


def _client_body(
    arrays: dict[str, np.ndarray], binary: bool, **kwargs: object
) -> tuple[bytes, str | None]:
    inputs = []
    for datatype, array in arrays.items():
        tensor = http.InferInput(datatype.lower(), list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    body, json_size = http.InferenceServerClient.generate_request_body(
        inputs,
        **kwargs,  # type: ignore[arg-type]
    )
    return body, None if json_size is None else str(json_size)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_from_tritonclient_round_trips(binary: bool) -> None:
    arrays = dict(ALL_TYPES)
    if binary:
        arrays["BF16"] = np.array([1.5, -2.0, 0.0], dtype=ml_dtypes.bfloat16)
    else:  # BYTES over JSON are UTF-8 text
        arrays["BYTES"] = np.array([b"", "h\u00e9".encode(), b"ok"], dtype=np.object_)
    body, header_length = _client_body(
        arrays, binary, request_id="r-1", parameters={"tag": "x", "n": 3}
    )
    request = parse_rest(body, header_length)
    assert request.id == "r-1" and dict(request.parameters) == {"tag": "x", "n": 3}
    for datatype, array in arrays.items():
        tensor = request.input(datatype.lower())
        assert tensor.datatype == datatype and tensor.shape == array.shape
        assert tensor.as_numpy().tolist() == array.tolist(), datatype
    # What goes to Triton: every input in binary, and it parses back to the same values.
    encoded, headers = encode_rest(request)
    again = parse_rest(encoded, headers[HEADER_LENGTH])
    assert [t.raw() for t in again.inputs] == [t.raw() for t in request.inputs]
    header = json.loads(encoded[: int(headers[HEADER_LENGTH])])
    assert all(
        "data" not in item and "binary_data_size" in item["parameters"] for item in header["inputs"]
    )


def test_outputs_and_reserved_parameters_are_kept_or_refused() -> None:
    body, size = _client_body(
        {"FP32": ALL_TYPES["FP32"]},
        True,
        outputs=[http.InferRequestedOutput("out", binary_data=False, class_count=3)],
        timeout=5000,
    )
    request = parse_rest(body, size)
    assert request.outputs[0].name == "out" and request.outputs[0].binary_data is False
    assert request.outputs[0].class_count == 3 and request.timeout_us == 5000
    for parameter, field in (
        ({"priority": 1}, "parameters.priority"),
        ({"sequence_id": 7}, "parameters.sequence_id"),
        (
            {"triton_enable_empty_final_response": True},
            "parameters.triton_enable_empty_final_response",
        ),
        ({"headers": "x"}, "parameters.headers"),
        ({"x": [1]}, "parameters.x"),
    ):
        doc = {
            "parameters": parameter,
            "inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}],
        }
        with pytest.raises(BadRequest) as refused:
            parse_rest(json.dumps(doc).encode())
        assert refused.value.field == field


def _doc(**input_fields: object) -> bytes:
    item = {"name": "a", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0], **input_fields}
    return json.dumps({"inputs": [item]}).encode()


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b'{"inputs": [], "inputs": [{"name": "a"}]}', "inputs", "repeats the key"),
        (b'{"inputs": [{"name": "a", "name": "b"}]}', "name", "repeats the key"),
        (b'{"inputs": [{"name": "a\\ud800"}]}', "body", "surrogate"),
        (b'{"inputs": [{"name": "\xff"}]}', "body", "UTF-8"),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
            "body",
            "NaN",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": ['
            + b"9" * 5000
            + b"]}]}",
            "body",
            "too long",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "body", "levels deep"),
        (_doc(data=[1.0]), "inputs.0.data", "has 1 data elements; shape [2] needs 2"),
        (_doc(shape=[2**31, 2**31], data=[1.0]), "inputs.0.shape", "between 0 and"),
        (_doc(shape=[-1]), "inputs.0.shape", "between 0 and"),
        (_doc(shape=[1] * 17, data=[1.0]), "inputs.0.shape", "at most 16"),
        (_doc(shape=[2.0]), "inputs.0.shape", "integers"),
        (_doc(datatype="FLOAT"), "inputs.0.datatype", "datatype must be one of"),
        (_doc(datatype="INT32"), "inputs.0.data", "must be integers"),
        (_doc(datatype="INT8", data=[1, 300]), "inputs.0.data", "INT8 range"),
        (_doc(datatype="UINT8", data=[1, -1]), "inputs.0.data", "UINT8 range"),
        (_doc(datatype="FP16", data=[1.0, 1e6]), "inputs.0.data", "FP16 range"),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1e999]}]}',
            "inputs.0.data",
            "FP32 range",
        ),
        (_doc(data=[True, 1.0]), "inputs.0.data", "must be numbers"),
        (_doc(data=["1", "2"]), "inputs.0.data", "must be numbers"),
        (_doc(datatype="BOOL", data=[1, 0]), "inputs.0.data", "true or false"),
        (_doc(datatype="BYTES", data=["ok", "\ud800"]), "inputs.0.data", "item 1 holds a lone"),
        (_doc(datatype="BF16"), "inputs.0.data", "binary"),
        (_doc(data=[[1.0], 2.0]), "inputs.0.data", "mixes arrays and values"),
        (_doc(data=5), "inputs.0.data", "must be a JSON array"),
        (
            _doc(parameters={"shared_memory_region": "r"}),
            "inputs.0.parameters.shared_memory_region",
            "shared",
        ),
        (_doc(parameters={"binary_data_size": 8}), "inputs.0.data", "both data and"),
        (_doc(extra=1), "inputs.0", "unknown field 'extra'"),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32"}]}',
            "inputs.0.data",
            "neither",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", '
            b'"parameters": {"binary_data_size": 4}}]}',
            "inputs.0.parameters.binary_data_size",
            "no Inference-Header-Content-Length",
        ),
        (
            b'{"inputs": [{"name": "", "shape": [1], "datatype": "FP32", "data": [1]}]}',
            "inputs.0.name",
            "non-empty",
        ),
        (
            b'{"inputs": [{"name": "a\\n", "shape": [1], "datatype": "FP32", "data": [1]}]}',
            "inputs.0.name",
            "printable",
        ),
        (
            b'{"id": 5, "inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}]}',
            "id",
            "string",
        ),
        (
            b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1]}], '
            b'"outputs": [{"name": "o", "parameters": {"shared_memory_region": "r"}}]}',
            "outputs.0.parameters.shared_memory_region",
            "shared",
        ),
        (b'{"inputs": {}}', "inputs", "list of 1 to 64"),
        (b"[]", "body", "JSON object"),
        (b"", "body", "not valid JSON"),
    ],
)
def test_malformed_bodies_are_refused_naming_the_field(body: bytes, field: str, words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_rest(body)
    assert refused.value.field == field and words in refused.value.detail, refused.value.detail


def _binary(header: dict[str, object], tail: bytes) -> tuple[bytes, str]:
    encoded = json.dumps(header).encode()
    return encoded + tail, str(len(encoded))


def _binary_input(datatype: str, shape: list[int], size: int) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "a",
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": size},
            }
        ]
    }


@pytest.mark.parametrize(
    ("body", "header_length", "field", "words"),
    [
        (
            *_binary(_binary_input("FP32", [2], 8), b"\0" * 4),
            "inputs.0.parameters.binary_data_size",
            "runs past",
        ),
        (*_binary(_binary_input("FP32", [2], 4), b"\0" * 4), "inputs.0", "needs 8"),
        (*_binary(_binary_input("FP32", [1], 4), b"\0" * 8), HEADER_LENGTH, "add up to 4"),
        (
            *_binary(
                _binary_input("BYTES", [1], 9), struct.pack("<I", 1) + b"x" + struct.pack("<I", 0)
            ),
            "inputs.0",
            "exactly 1",
        ),
        (
            *_binary(_binary_input("BYTES", [1], 8), struct.pack("<I", 100) + b"abcd"),
            "inputs.0",
            "exactly 1",
        ),
        (*_binary(_binary_input("BYTES", [3], 8), b"\0" * 8), "inputs.0", "cannot hold 3"),
        (b'{"inputs": []}', "x", HEADER_LENGTH, "whole number"),
        (b'{"inputs": []}', "0", HEADER_LENGTH, "whole number"),
        (b'{"inputs": []}', "999", HEADER_LENGTH, "whole number"),
        (b'{"inputs": []}', "\uff11", HEADER_LENGTH, "whole number"),
    ],
)
def test_binary_extension_sizes_must_match_the_bytes(
    body: bytes, header_length: str, field: str, words: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_rest(body, header_length)
    assert refused.value.field == field and words in refused.value.detail, refused.value.detail


def test_nested_data_is_flattened_row_major() -> None:
    body = _doc(shape=[2, 2], data=[[1, 2], [3, 4]])
    assert parse_rest(body).inputs[0].as_numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_limits_are_configurable() -> None:
    with pytest.raises(BadRequest, match="levels deep"):
        parse_rest(_doc(shape=[2, 1], data=[[1], [2]]), limits=ParseLimits(max_depth=4))


def test_depth_scan_ignores_brackets_inside_strings() -> None:
    assert nesting_depth(b'{"a": "[[[[[[[[", "b": [[1]]}') == 3
    assert nesting_depth(b'["\\"[[[["]') == 1


def test_requests_built_in_code_encode_like_client_ones() -> None:
    texts = InputTensor.from_numpy("TEXT", np.array([["a"], ["\u00e9"]], dtype=np.object_))
    pixels = InputTensor.from_numpy("X", np.ones((1, 3), dtype=np.float32))
    body, headers = encode_rest(InferRequest(inputs=(texts, pixels)))
    parsed = parse_rest(body, headers[HEADER_LENGTH])
    assert parsed.input("TEXT").as_numpy().tolist() == [[b"a"], ["\u00e9".encode()]]
    assert parsed.input("X").datatype == "FP32" and parsed.input("X").as_numpy().tolist() == [
        [1.0, 1.0, 1.0]
    ]


# -- compressed bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decoder_round_trips_in_chunks(encoding: str) -> None:
    plain = bytes(range(256)) * 400
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    decoder = BoundedDecoder(encoding, max_bytes=len(plain))
    out = (
        b"".join(decoder.feed(packed[i : i + 1000]) for i in range(0, len(packed), 1000))
        + decoder.finish()
    )
    assert out == plain


def test_an_empty_body_labelled_compressed_stays_empty() -> None:
    decoder = BoundedDecoder("gzip", max_bytes=10)
    assert decoder.feed(b"") == b"" and decoder.finish() == b""


def test_decompression_bomb_stops_at_the_cap() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # 50 MB in about 50 KB
    decoder = BoundedDecoder("gzip", max_bytes=1_000_000)
    with pytest.raises(PayloadTooLarge):
        decoder.feed(bomb)
    assert decoder.produced <= 1_000_000 + (1 << 20)  # never more than one slice past the cap


@pytest.mark.parametrize(
    ("encoding", "data", "words"),
    [
        ("gzip", b"not gzip at all", "not valid gzip"),
        ("deflate", b"\x00\x01\x02", "not valid deflate"),
        ("gzip", gzip.compress(b"x" * 100)[:-6], "ends before"),
        ("gzip", gzip.compress(b"x") + b"trailing", "continues after"),
    ],
)
def test_corrupt_compressed_bodies_are_bad_requests(encoding: str, data: bytes, words: str) -> None:
    decoder = BoundedDecoder(encoding, max_bytes=10_000)
    with pytest.raises(BadRequest, match=words):
        decoder.feed(data)
        decoder.finish()


# -- what Triton's messages may show ---------------------------------------------------------


def test_safe_message_drops_tracebacks_paths_and_addresses() -> None:
    message = (
        "[request id: abc] Failed to process the request(s) for model 'm_0_0', message: ValueError: bad\n\n"
        "At:\n  /opt/models/m/1/model.py(13): execute\n"
    )
    assert (
        safe_message(message)
        == "Failed to process the request(s) for model 'm_0_0', message: ValueError: bad"
    )
    shown = safe_message(
        "cannot identify image file <_io.BytesIO object at 0x7f3a1b2c3d4e> in /usr/lib/x/y.py"
    )
    assert "0x7f" not in shown and "/usr/lib" not in shown and "cannot identify image file" in shown
    assert (
        safe_message("input is not an image (JPEG/PNG/...)")
        == "input is not an image (JPEG/PNG/...)"
    )
    assert len(safe_message("x" * 5000)) <= 400


def test_public_api_of_the_request_package() -> None:
    import gateway.protocol.kserve

    assert set(gateway.protocol.kserve.__all__) == {
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
    }
    assert all(hasattr(gateway.protocol.kserve, name) for name in gateway.protocol.kserve.__all__)


def test_datatypes_come_from_tritons_schema_and_tritonclient_maps_each() -> None:
    from tritonclient.utils import triton_to_np_dtype

    from gateway.protocol.kserve import DATATYPES, element_size

    assert {"BOOL", "FP16", "FP32", "BF16", "INT64", "UINT64", "BYTES"} <= set(DATATYPES)
    assert all(triton_to_np_dtype(datatype) is not None for datatype in DATATYPES)
    assert element_size("BF16") == 2 and element_size("BYTES") is None


def test_work_bytes_weigh_what_checking_a_body_costs() -> None:
    """Binary data weighs what its JSON header declares: a copy for numbers, Python work per BYTES
    element, also when the header spells BYTES through an escape or adds a negative dimension;
    JSON weighs whole, and so does a body whose header length is bad."""
    image = RestBody(*_client_body({"UINT8": np.zeros((1, 600_000), dtype=np.uint8)}, binary=True))
    assert image.work_bytes < 2_000 < len(image.body)
    one_string = RestBody(
        *_client_body({"BYTES": np.array([bytes(600_000)], dtype=np.object_)}, binary=True)
    )
    assert one_string.work_bytes < 2_000 < len(one_string.body)
    strings = RestBody(
        *_client_body({"BYTES": np.array([b""] * 20_000, dtype=np.object_)}, binary=True)
    )
    assert strings.work_bytes >= 20_000 * 4
    values = RestBody(*_client_body({"FP32": np.zeros(20_000, dtype=np.float32)}, binary=False))
    assert values.work_bytes == len(values.body)
    assert image.header_length is not None
    header, tail = image.body[: int(image.header_length)], image.body[int(image.header_length) :]
    escaped = header.replace(b'"UINT8"', b'"\\u0042YTES"')
    assert (
        RestBody(escaped + tail, str(len(escaped))).work_bytes >= 150_000 * 4
    )  # one element per 4 bytes at most
    document = json.loads(strings.body[: int(strings.header_length or 0)])
    document["inputs"].append(
        {
            "name": "y",
            "datatype": "BYTES",
            "shape": [-20_000],
            "parameters": {"binary_data_size": 0},
        }
    )
    cancelling = json.dumps(document).encode()
    tail = strings.body[int(strings.header_length or 0) :]
    assert RestBody(cancelling + tail, str(len(cancelling))).work_bytes >= 20_000 * 4
    assert RestBody(image.body, "twelve").work_bytes == len(image.body)


def test_grpc_work_bytes_weigh_raw_bytes_elements() -> None:
    from tritonclient.grpc import service_pb2 as pb

    def message(datatype: str) -> GrpcBody:
        request = pb.ModelInferRequest(model_name="m")
        request.inputs.add(name="x", datatype=datatype, shape=[1, 600_000])
        request.raw_input_contents.append(bytes(600_000))
        return GrpcBody(request)

    assert message("UINT8").work_bytes < 2_000
    assert message("BYTES").work_bytes >= 600_000  # as many as 150,000 elements of 4 bytes
