"""Hostile inputs for the gateway's task APIs: embedding texts and image-generation parameters.

See :mod:`tests.support.hostile_corpus` for the case types.
"""

from __future__ import annotations

from collections.abc import Iterator

from serving.limits import DEFAULT_LIMITS
from tests.support.hostile_corpus import (
    CLIENTS_DIMENSIONS,
    INTERNALS,
    TENANCY_LIMITS,
    TENANCY_NAMES,
    Hostile,
    HttpAttempt,
    json_body,
    json_bytes,
    raw_body,
)

__all__ = ["embedding_cases", "generation_cases"]

_TOO_MANY = DEFAULT_LIMITS.embeddings.max_inputs + 1


def embedding_cases() -> Iterator[Hostile]:
    f = "embedding-texts"
    cases: list[tuple[str, object, tuple[int, ...], str | None]] = [
        ("text-1MB", "a" * (1 << 20), (400, 422), TENANCY_LIMITS),
        ("texts-4x1MB", ["a" * (1 << 20)] * 4, (400, 413, 422), None),
        ("text-8193-chars", "b" * 8193, (400, 422), TENANCY_LIMITS),
        ("text-1MB-of-4-byte-chars", "\U0001f600" * (1 << 18), (400, 422), TENANCY_LIMITS),
        (f"inputs-{_TOO_MANY}", ["x"] * _TOO_MANY, (400, 422), TENANCY_LIMITS),
        ("inputs-10000", ["x"] * 10_000, (400, 422), TENANCY_LIMITS),
        ("input-empty-string", "", (400, 422), None),
        ("inputs-one-empty", ["ok", ""], (400, 422), None),
        ("input-number", 7, (400, 422), None),
        ("input-null", None, (400, 422), None),
        ("input-object", {"text": "x"}, (400, 422), None),
        ("input-nested-lists", [["a", ["b"]]], (400, 422), None),
        ("input-mixed", ["a", 1, None], (400, 422), None),
        ("input-empty-list", [], (400, 422), None),
    ]
    for label, value, expect, owner in cases:
        yield Hostile(
            f"{f}/{label}",
            f,
            HttpAttempt(
                "POST", "/v1/embeddings", json_body({"model": "text_embedding", "input": value})
            ),
            frozenset(expect),
            ("input", "limit"),
            owner,
            INTERNALS,
        )
    raw = [
        (
            "lone-surrogate",
            b'{"model": "text_embedding", "input": ["ok", "\\ud800"]}',
            (400,),
            TENANCY_LIMITS,
            "surrogate",
        ),
        (
            "lone-low-surrogate",
            b'{"model": "text_embedding", "input": "a\\udfff"}',
            (400,),
            TENANCY_LIMITS,
            "surrogate",
        ),
        (
            "invalid-utf8",
            b'{"model": "text_embedding", "input": "caf\xe9"}',
            (400, 422),
            None,
            "parsing the body",
        ),
        (
            "deep-100k",
            b'{"model": "text_embedding", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            (400, 422),
            None,
            "parsing the body",
        ),
        ("not-json", b"model=text_embedding&input=x", (400, 422), None, "JSON"),
        (
            "encoding-format-hex",
            b'{"model": "text_embedding", "input": "x", "encoding_format": "hex"}',
            (400, 422),
            None,
            "encoding_format",
        ),
        (
            "dimensions-zero",
            b'{"model": "text_embedding", "input": "x", "dimensions": 0}',
            (400, 422),
            CLIENTS_DIMENSIONS,
            "dimensions",
        ),
        (
            "dimensions-huge",
            b'{"model": "text_embedding", "input": "x", "dimensions": 1000000000}',
            (400, 422),
            CLIENTS_DIMENSIONS,
            "dimensions",
        ),
        ("model-unknown", b'{"model": "gpt-5", "input": "x"}', (404,), None, "gpt-5"),
        ("model-empty", b'{"model": "", "input": "x"}', (400, 404, 422), None, "model"),
        (
            "model-10k",
            b'{"model": "' + b"m" * 10_000 + b'", "input": "x"}',
            (400, 404, 422),
            TENANCY_NAMES,
            "model",
        ),
    ]
    for label, body, expect, owner, mention in raw:
        yield Hostile(
            f"{f}/{label}",
            f,
            HttpAttempt(
                "POST", "/v1/embeddings", raw_body(body), {"Content-Type": "application/json"}
            ),
            frozenset(expect),
            (mention,),
            owner,
            INTERNALS,
        )
    # Within the documented limits: answered.
    for label, value in (
        ("inputs-64", ["x"] * 64),
        ("inputs-33", [f"t{i}" for i in range(33)]),
        ("text-8192-chars", "c" * 8192),
        ("text-with-nul", "a\u0000b"),
        ("brackets-in-text", "[" * 5000),
    ):
        owner = TENANCY_LIMITS if label in ("inputs-64", "inputs-33") else None
        yield Hostile(
            f"{f}/{label}",
            f,
            HttpAttempt(
                "POST", "/v1/embeddings", json_body({"model": "text_embedding", "input": value})
            ),
            frozenset({200}),
            (),
            owner,
            INTERNALS,
        )


def generation_cases() -> Iterator[Hostile]:
    f = "image-generation"
    base = {"prompt": "a fox", "size": "64x64"}
    cases: list[tuple[str, bytes, str, str | None]] = [
        ("seed-2^63", json_bytes({**base, "seed": 2**63}), "seed", TENANCY_LIMITS),
        ("seed-2^64", json_bytes({**base, "seed": 2**64}), "seed", TENANCY_LIMITS),
        ("seed-10^30", json_bytes({**base, "seed": 10**30}), "seed", TENANCY_LIMITS),
        ("seed-negative", json_bytes({**base, "seed": -1}), "seed", None),
        ("seed-float", json_bytes({**base, "seed": 1.5}), "seed", None),
        ("steps-zero", json_bytes({**base, "steps": 0}), "steps", None),
        ("steps-10^9", json_bytes({**base, "steps": 10**9}), "steps", None),
        ("size-99999", json_bytes({**base, "size": "99999x99999"}), "size", None),
        ("size-9999x9999", json_bytes({**base, "size": "9999x9999"}), "size", None),
        ("size-not-multiple", json_bytes({**base, "size": "1024x1023"}), "size", None),
        ("size-zero", json_bytes({**base, "size": "0x0"}), "size", None),
        ("size-three-dims", json_bytes({**base, "size": "64x64x64"}), "size", None),
        ("guidance-1e308", json_bytes({**base, "guidance_scale": 1e308}), "guidance", None),
        (
            "guidance-nan",
            b'{"prompt": "a fox", "size": "64x64", "guidance_scale": NaN}',
            "guidance",
            None,
        ),
        ("prompt-1MB", json_bytes({**base, "prompt": "p" * (1 << 20)}), "prompt", None),
        ("prompt-empty", json_bytes({**base, "prompt": ""}), "prompt", None),
        (
            "prompt-surrogate",
            b'{"prompt": "a \\ud800 fox", "size": "64x64"}',
            "prompt",
            TENANCY_LIMITS,
        ),
        ("n-1000", json_bytes({**base, "n": 1000}), "n", None),
        (
            "negative-prompt-1MB",
            json_bytes({**base, "negative_prompt": "n" * (1 << 20)}),
            "negative_prompt",
            TENANCY_LIMITS,
        ),
    ]
    for label, body, mention, owner in cases:
        yield Hostile(
            f"{f}/{label}",
            f,
            HttpAttempt(
                "POST",
                "/v1/images/generations",
                raw_body(body),
                {"Content-Type": "application/json"},
            ),
            frozenset({400, 422}),
            (mention,),
            owner,
            INTERNALS,
        )
