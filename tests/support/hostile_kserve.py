"""Hostile KServe v2 JSON bodies: structure, deadlines, JSON text and shapes, for each served model.

:func:`kserve_cases` also gathers the binary-extension and compressed bodies of
:mod:`tests.support.hostile_encoded`, so the suite asks one function for every KServe v2 body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from tests.support.hostile_corpus import (
    KSERVE_TARGETS,
    Hostile,
    bad_request,
    binary_body,
    good_input,
    json_body,
    raw_body,
)
from tests.support.hostile_encoded import binary_cases, compression_cases

__all__ = ["kserve_cases"]


def _structure_cases(model: str, name: str, datatype: str, dims: list[int]) -> Iterator[Hostile]:
    good = good_input(name, datatype, dims)
    f = "kserve-structure"
    other = "FP32" if datatype == "BYTES" else "BYTES"
    yield bad_request(
        "datatype-unknown",
        f,
        model,
        json_body({"inputs": [{**good, "datatype": "FLOAT32"}]}),
        "datatype",
    )
    yield bad_request(
        "datatype-lowercase",
        f,
        model,
        json_body({"inputs": [{**good, "datatype": datatype.lower()}]}),
        "datatype",
    )
    yield bad_request(
        "datatype-other",
        f,
        model,
        json_body({"inputs": [{**good, "datatype": other}]}),
        name,
        "data",
    )
    yield bad_request(
        "shape-negative", f, model, json_body({"inputs": [{**good, "shape": [-1, *dims]}]}), "shape"
    )
    yield bad_request(
        "shape-float", f, model, json_body({"inputs": [{**good, "shape": [1.0, *dims]}]}), "shape"
    )
    yield bad_request(
        "shape-string", f, model, json_body({"inputs": [{**good, "shape": "1"}]}), "shape"
    )
    yield bad_request(
        "shape-bool", f, model, json_body({"inputs": [{**good, "shape": [True, *dims]}]}), "shape"
    )
    yield bad_request(
        "shape-17-dims", f, model, json_body({"inputs": [{**good, "shape": [1] * 17}]}), "shape"
    )
    yield bad_request(
        "shape-missing",
        f,
        model,
        json_body({"inputs": [{k: v for k, v in good.items() if k != "shape"}]}),
        "shape",
    )
    yield bad_request("name-empty", f, model, json_body({"inputs": [{**good, "name": ""}]}), "name")
    yield bad_request("name-number", f, model, json_body({"inputs": [{**good, "name": 7}]}), "name")
    yield bad_request(
        "name-nul", f, model, json_body({"inputs": [{**good, "name": name + "\u0000"}]}), "name"
    )
    yield bad_request(
        "name-10k", f, model, json_body({"inputs": [{**good, "name": "x" * 10_000}]}), "name"
    )
    yield bad_request("name-twice", f, model, json_body({"inputs": [good, good]}), "twice")
    small = {"shape": [1], "data": ["x"] if datatype == "BYTES" else [0.0]}
    yield bad_request(
        "inputs-65",
        f,
        model,
        json_body({"inputs": [{**good, **small, "name": f"i{i}"} for i in range(65)]}),
        "inputs",
    )
    yield bad_request("inputs-empty", f, model, json_body({"inputs": []}), "inputs")
    yield bad_request("inputs-object", f, model, json_body({"inputs": good}), "inputs")
    yield bad_request("inputs-missing", f, model, json_body({"outputs": []}), "inputs")
    yield bad_request(
        "unknown-top-field", f, model, json_body({"inputs": [good], "model": "other"}), "model"
    )
    # KServe's Python client names the model in the body too: another model than the path's is refused.
    yield bad_request(
        "model-name-not-the-path",
        f,
        model,
        json_body({"inputs": [good], "model_name": "other"}),
        "model_name",
    )
    yield bad_request(
        "unknown-input-field",
        f,
        model,
        json_body({"inputs": [{**good, "contents": {}}]}),
        "contents",
    )
    yield bad_request(
        "data-and-binary",
        f,
        model,
        json_body({"inputs": [{**good, "parameters": {"binary_data_size": 4}}]}),
        "both",
    )
    yield bad_request(
        "no-data",
        f,
        model,
        json_body({"inputs": [{k: v for k, v in good.items() if k != "data"}]}),
        "neither",
    )
    yield bad_request(
        "data-scalar", f, model, json_body({"inputs": [{**good, "data": 1}]}), "array"
    )
    yield bad_request(
        "data-object", f, model, json_body({"inputs": [{**good, "data": {"a": 1}}]}), "array"
    )
    yield bad_request(
        "data-ragged",
        f,
        model,
        json_body({"inputs": [{**good, "shape": [2, 1], "data": [["a"], "b"]}]}),
        "mixes",
    )
    yield bad_request(
        "data-null",
        f,
        model,
        json_body({"inputs": [{**good, "shape": [1, 1], "data": [None]}]}),
        name,
    )
    yield bad_request(
        "shared-memory-input",
        f,
        model,
        json_body(
            {
                "inputs": [
                    {
                        **{k: v for k, v in good.items() if k != "data"},
                        "parameters": {
                            "shared_memory_region": "input_data",
                            "shared_memory_byte_size": 16,
                        },
                    }
                ]
            }
        ),
        "shared memory",
    )
    yield bad_request(
        "shared-memory-output",
        f,
        model,
        json_body(
            {
                "inputs": [good],
                "outputs": [{"name": "x", "parameters": {"shared_memory_region": "out"}}],
            }
        ),
        "shared memory",
    )
    yield bad_request(
        "sequence-id",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"sequence_id": 42, "sequence_start": True}}),
        "sequence",
    )
    yield bad_request(
        "reserved-triton-param",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"triton_enable_empty_final_response": True}}),
        "reserved",
    )
    yield bad_request(
        "param-nested",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"x": {"y": 1}}}),
        "parameters.x",
    )
    yield bad_request(
        "params-33",
        f,
        model,
        json_body({"inputs": [good], "parameters": {f"p{i}": i for i in range(33)}}),
        "parameters",
    )
    yield bad_request(
        "param-huge-int",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"x": 2**64}}),
        "parameters.x",
    )
    yield bad_request("id-object", f, model, json_body({"inputs": [good], "id": {"x": 1}}), "id")
    yield bad_request("id-10k", f, model, json_body({"inputs": [good], "id": "r" * 10_000}), "id")
    yield bad_request(
        "output-twice",
        f,
        model,
        json_body({"inputs": [good], "outputs": [{"name": "o"}, {"name": "o"}]}),
        "twice",
    )
    yield bad_request(
        "output-binary-string",
        f,
        model,
        json_body(
            {"inputs": [good], "outputs": [{"name": "o", "parameters": {"binary_data": "yes"}}]}
        ),
        "binary_data",
    )
    yield bad_request(
        "classification-huge",
        f,
        model,
        json_body(
            {"inputs": [good], "outputs": [{"name": "o", "parameters": {"classification": 10**9}}]}
        ),
        "classification",
    )
    yield bad_request("body-array", f, model, raw_body(b"[]"), "object")
    yield bad_request("body-empty", f, model, raw_body(b""), "JSON")
    yield bad_request(
        "body-truncated", f, model, raw_body(json.dumps({"inputs": [good]}).encode()[:-7]), "JSON"
    )
    yield bad_request(
        "body-trailing-garbage",
        f,
        model,
        raw_body(json.dumps({"inputs": [good]}).encode() + b"}{"),
        "JSON",
    )


def _deadline_cases(model: str, name: str, datatype: str, dims: list[int]) -> Iterator[Hostile]:
    # A client may not pick its own Triton priority, and its timeout must be a sane integer.
    good = good_input(name, datatype, dims)
    f = "deadlines"
    yield bad_request(
        "priority-1",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"priority": 1}}),
        "priority",
    )
    yield bad_request(
        "priority-huge",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"priority": 2**63}}),
        "priority",
    )
    yield bad_request(
        "timeout-negative",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"timeout": -1}}),
        "timeout",
    )
    yield bad_request(
        "timeout-2^64",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"timeout": 2**64}}),
        "timeout",
    )
    yield bad_request(
        "timeout-string",
        f,
        model,
        json_body({"inputs": [good], "parameters": {"timeout": "forever"}}),
        "timeout",
    )


def _json_text_cases(model: str, name: str, datatype: str, dims: list[int]) -> Iterator[Hostile]:
    good = json.dumps({"inputs": [good_input(name, datatype, dims)]}).encode()
    dup, utf8, deep = "duplicate-keys", "invalid-utf8-and-escapes", "deep-nesting"
    huge = json.dumps(
        {"name": name, "shape": [2**31 - 1, 2**31 - 1], "datatype": datatype, "data": []}
    )
    yield bad_request(
        "inputs-twice",
        dup,
        model,
        raw_body(good[:-1] + b', "inputs": [' + huge.encode() + b"]}"),
        "repeats",
    )
    yield bad_request(
        "inputs-twice-escaped",
        dup,
        model,
        raw_body(good[:-1] + b', "\\u0069nputs": []}'),
        "repeats",
    )
    yield bad_request(
        "shape-twice",
        dup,
        model,
        raw_body(good.replace(b'"shape": [', b'"shape": [99999999], "shape": [', 1)),
        "repeats",
    )
    yield bad_request(
        "datatype-twice",
        dup,
        model,
        raw_body(good.replace(b'"datatype": ', b'"datatype": "BOOL", "datatype": ', 1)),
        "repeats",
    )
    yield bad_request(
        "name-twice-key",
        dup,
        model,
        raw_body(good.replace(b'"name": ', b'"name": "other", "name": ', 1)),
        "repeats",
    )
    yield bad_request(
        "parameters-twice",
        dup,
        model,
        raw_body(good[:-1] + b', "parameters": {"a": 1, "a": 2}}'),
        "repeats",
    )
    yield bad_request(
        "invalid-byte",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "\xff', 1)),
        "UTF-8",
    )
    yield bad_request(
        "escape-then-invalid",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "\\u00e9\xc3', 1)),
        "UTF-8",
    )
    yield bad_request(
        "overlong-slash",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "\xc0\xaf', 1)),
        "UTF-8",
    )
    yield bad_request(
        "encoded-surrogate",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "\xed\xa0\x80', 1)),
        "UTF-8",
    )
    yield bad_request(
        "lone-high-surrogate",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "\\ud800', 1)),
        "surrogate",
    )
    yield bad_request(
        "lone-low-surrogate-key", utf8, model, raw_body(good[:-1] + b', "\\udc00": 1}'), "surrogate"
    )
    yield bad_request(
        "reversed-pair",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "\\udc00\\ud800', 1)),
        "surrogate",
    )
    yield bad_request("utf16-body", utf8, model, raw_body(good.decode().encode("utf-16")), "UTF-8")
    yield bad_request(
        "latin1-body",
        utf8,
        model,
        raw_body(good.replace(b'"name": "', b'"name": "caf\xe9', 1)),
        "UTF-8",
    )
    yield bad_request(
        "nan-literal", utf8, model, raw_body(good[:-1] + b', "parameters": {"x": NaN}}'), "NaN"
    )
    yield bad_request(
        "infinity-literal",
        utf8,
        model,
        raw_body(good[:-1] + b', "parameters": {"x": -Infinity}}'),
        "Infinity",
    )
    yield bad_request(
        "5000-digit-number",
        utf8,
        model,
        raw_body(good[:-1] + b', "parameters": {"x": ' + b"9" * 5000 + b"}}"),
        "number",
    )
    for depth in (25, 1_000, 60_000, 1_500_000):
        nested = b"[" * depth + b"]" * depth
        yield bad_request(
            f"data-{depth}",
            deep,
            model,
            raw_body(good.replace(b'"data": [', b'"data": [' + nested + b",", 1)),
            "levels deep",
        )
    yield bad_request(
        "parameters-100k",
        deep,
        model,
        raw_body(
            good[:-1] + b', "parameters": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}"
        ),
        "levels deep",
    )
    yield bad_request(
        "unclosed-1m", deep, model, raw_body(b'{"inputs": [' + b"[" * 1_000_000), "levels deep"
    )


def _shape_cases(model: str, name: str, datatype: str, dims: list[int]) -> Iterator[Hostile]:
    f = "declared-shapes"
    one = ["x"] if datatype == "BYTES" else [1.0]
    for label, shape in (
        ("2^40", [2**40]),
        ("2^31-squared", [2**31 - 1, 2**31 - 1]),
        ("batch-2^30", [2**30, *dims]),
        ("four-dims", [32008, 25555173, 1026, 2033]),
        ("int64-max", [2**63 - 1]),
        ("2^64", [2**64]),
    ):
        yield bad_request(
            f"json-{label}",
            f,
            model,
            json_body(
                {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": one}]}
            ),
            "shape",
        )
    yield bad_request(
        "escaped-shape-key",
        f,
        model,
        raw_body(
            b'{"inputs":[{"name":"'
            + name.encode()
            + b'","\\u0073hape":[1099511627776],"datatype":"'
            + datatype.encode()
            + b'","data":[1]}]}'
        ),
        "shape",
        "data",
    )
    body, headers = binary_body(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": [2**40],
                    "datatype": datatype,
                    "parameters": {"binary_data_size": 4},
                }
            ]
        },
        b"\0" * 4,
    )
    yield bad_request("binary-2^40", f, model, body, "shape", "binary", headers=headers)


def kserve_cases() -> list[Hostile]:
    """KServe v2 bodies, for each model the hostile gateway serves."""
    cases: list[Hostile] = []
    for target in KSERVE_TARGETS:
        for family in (
            _structure_cases,
            _deadline_cases,
            _json_text_cases,
            _shape_cases,
            binary_cases,
        ):
            cases.extend(family(*target))
    # Compression is per request, not per model: one model is enough.
    cases.extend(compression_cases(*KSERVE_TARGETS[2]))
    return cases
