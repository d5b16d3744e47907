"""Fault 5 - hostile input: schema-driven fuzzing of every route, and random raw bodies.

- schemathesis (4.x Python API) reads the live gateway's OpenAPI document and generates requests
  for every operation, valid and invalid (positive and negative generation), with credentials so
  they get past authentication, and again without them. Every answer must be < 500.
- hypothesis throws raw bodies (random bytes, random JSON, deep nesting, binary-extension headers
  that lie about their length) at the KServe passthrough, ``/v1/embeddings`` and ``/v1/classify``.
- Afterwards the gateway and Triton must still be alive and serve a normal request.

The counts of generated requests are printed; at least 1,000 in total, zero 5xx.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from gateway.app import PUBLIC_PATHS, PUBLIC_PREFIXES
from tests.support.gateway_procs import ADMIN_TOKEN, create_key, tiny_request

pytestmark = pytest.mark.integration

#: examples per operation and generation mode; 17 operations x (2 x 36 + 8) > 1,000 requests
WITH_AUTH_EXAMPLES = 36
WITHOUT_AUTH_EXAMPLES = 8
RAW_EXAMPLES = 150
MIN_TOTAL_REQUESTS = 1000
_SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=False,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: failures are collected, not raised
    suppress_health_check=list(HealthCheck),
)
_TOTALS: Counter[str] = Counter()


@pytest.fixture(scope="module")
def fuzz_gateway(rel_triton, gateways):  # type: ignore[no-untyped-def]
    return gateways(rel_triton.http_url, max_body_bytes=64 * 1024, log_level="warning")


@pytest.fixture(scope="module")
def fuzz_headers(fuzz_gateway) -> dict[str, str]:  # type: ignore[no-untyped-def]
    headers, _ = create_key(fuzz_gateway)
    return {**headers, "X-Admin-Token": ADMIN_TOKEN}


def _public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _fuzz_schema(
    gateway, headers: dict[str, str] | None, examples: int, modes
) -> tuple[Counter, list]:  # type: ignore[no-untyped-def]
    schema = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
    statuses: Counter[int] = Counter()
    per_operation: Counter[str] = Counter()
    server_errors: list[str] = []
    unauthenticated_ok: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, **_SETTINGS)
            def run(case) -> None:  # type: ignore[no-untyped-def]
                try:
                    response = case.call(headers=headers, timeout=15)
                except Exception as exc:  # the gateway dropped the connection: as bad as a 5xx
                    statuses[0] += 1
                    server_errors.append(
                        f"{case.method} {case.formatted_path}: {type(exc).__name__}"
                    )
                    return
                statuses[response.status_code] += 1
                per_operation[case.operation.label] += 1
                if headers is None and not _public(case.path) and response.status_code < 400:
                    unauthenticated_ok.append(
                        f"{case.method} {case.formatted_path} -> {response.status_code}"
                    )
                if response.status_code >= 500:
                    server_errors.append(
                        f"{case.method} {case.formatted_path} -> {response.status_code}: "
                        f"{response.text[:300]}"
                    )

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (e.g. GET /healthz has no parameters)
                pass
    return statuses, [per_operation, server_errors, len(operations), unauthenticated_ok]


def test_schemathesis_every_route_with_credentials(  # type: ignore[no-untyped-def]
    fuzz_gateway, fuzz_headers
) -> None:
    started = time.monotonic()
    statuses, (per_operation, server_errors, n_ops, _) = _fuzz_schema(
        fuzz_gateway,
        fuzz_headers,
        WITH_AUTH_EXAMPLES,
        (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
    )
    sent = sum(statuses.values())
    _TOTALS["schemathesis_auth"] = sent
    print(
        f"\n[fuzz] schemathesis with credentials: {n_ops} operations, {sent} requests in "
        f"{time.monotonic() - started:.1f} s, statuses {dict(sorted(statuses.items()))}, "
        f"5xx={len(server_errors)}"
    )
    print(f"[fuzz] per operation: {dict(per_operation)}")
    assert not server_errors, "\n".join(server_errors[:20])
    assert fuzz_gateway.process.running()


def test_schemathesis_every_route_without_credentials(fuzz_gateway) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    statuses, (_, server_errors, n_ops, let_in) = _fuzz_schema(
        fuzz_gateway,
        None,
        WITHOUT_AUTH_EXAMPLES,
        (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
    )
    sent = sum(statuses.values())
    _TOTALS["schemathesis_anonymous"] = sent
    print(
        f"\n[fuzz] schemathesis without credentials: {n_ops} operations, {sent} requests in "
        f"{time.monotonic() - started:.1f} s, statuses {dict(sorted(statuses.items()))}, "
        f"5xx={len(server_errors)}"
    )
    assert not server_errors, "\n".join(server_errors[:20])
    assert not let_in, "protected routes answered without credentials:\n" + "\n".join(let_in[:20])


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=40,
)
_inputs = st.fixed_dictionaries(
    {
        "inputs": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["input", "DELAY_MS", "x", ""]),
                    "shape": st.lists(st.integers(min_value=-3, max_value=2**40), max_size=4),
                    "datatype": st.sampled_from(["FP32", "INT32", "BYTES", "FP16", "BOOL", "nope"]),
                    "data": _json_values,
                }
            ),
            max_size=3,
        )
    },
    optional={"outputs": _json_values, "parameters": _json_values, "id": _json_values},
)
_bodies = st.one_of(
    st.binary(max_size=2048),
    _json_values.map(lambda v: json.dumps(v).encode()),
    _inputs.map(lambda v: json.dumps(v).encode()),
    st.integers(min_value=1, max_value=60_000).map(_deep),
)
_binary_header = st.tuples(
    st.integers(min_value=-5, max_value=10**12).map(str), st.binary(max_size=512)
)


def test_hypothesis_raw_bodies_never_5xx(fuzz_gateway, fuzz_headers) -> None:  # type: ignore[no-untyped-def]
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    client = httpx.Client(base_url=fuzz_gateway.url, headers=fuzz_headers, timeout=15)

    def record(label: str, response: httpx.Response) -> None:
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            server_errors.append(f"{label} -> {response.status_code}: {response.text[:300]}")

    @given(
        body=_bodies,
        model=st.sampled_from(["tiny_linear", "slow_echo", "missing"]),
        content_type=st.sampled_from(
            ["application/json", "application/octet-stream", "text/plain"]
        ),
        binary_header=st.none() | _binary_header,
    )
    @settings(max_examples=RAW_EXAMPLES, **_SETTINGS)
    def kserve(  # type: ignore[no-untyped-def]
        body: bytes, model: str, content_type: str, binary_header
    ) -> None:
        headers = {"Content-Type": content_type}
        if binary_header is not None:
            length, tail = binary_header
            headers["Inference-Header-Content-Length"] = length
            body = body + tail
        record(
            f"infer {model} {body[:80]!r}",
            client.post(f"/v2/models/{model}/infer", content=body, headers=headers),
        )

    @given(body=_bodies)
    @settings(max_examples=RAW_EXAMPLES, **_SETTINGS)
    def embeddings(body: bytes) -> None:
        record(
            f"embeddings {body[:80]!r}",
            client.post(
                "/v1/embeddings", content=body, headers={"Content-Type": "application/json"}
            ),
        )

    @given(files=st.lists(st.binary(max_size=1024), max_size=10), raw=st.binary(max_size=512))
    @settings(max_examples=RAW_EXAMPLES, **_SETTINGS)
    def classify(files: list[bytes], raw: bytes) -> None:
        if files:
            response = client.post(
                "/v1/classify", files=[("file", (f"f{i}.jpg", f)) for i, f in enumerate(files)]
            )
        else:  # a body that claims to be multipart and is not
            response = client.post(
                "/v1/classify",
                content=raw,
                headers={"Content-Type": "multipart/form-data; boundary=xyz"},
            )
        record(f"classify {len(files)} files", response)

    started = time.monotonic()
    with client:
        kserve()
        embeddings()
        classify()
        alive = client.post("/v2/models/tiny_linear/infer", json=tiny_request())
    sent = sum(statuses.values())
    _TOTALS["hypothesis_raw"] = sent
    total = sum(_TOTALS.values())
    print(
        f"\n[fuzz] hypothesis raw bodies: {sent} requests in {time.monotonic() - started:.1f} s, "
        f"statuses {dict(sorted(statuses.items()))}, 5xx={len(server_errors)}"
    )
    print(f"[fuzz] generated requests in this module: {dict(_TOTALS)} total={total}")
    assert not server_errors, "\n".join(server_errors[:20])
    assert fuzz_gateway.process.running()
    assert alive.status_code == 200, "gateway or Triton stopped serving after the fuzzing"
    if {"schemathesis_auth", "schemathesis_anonymous"} <= set(_TOTALS):
        assert total >= MIN_TOTAL_REQUESTS, f"only {total} generated requests"


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs":[{"name":"input","shape":[1099511627776],"datatype":"FP32","data":[1.0]}]}',
        b'{"inputs":[{"name":"input","shape":[32008,25555173,1026,2033],"datatype":"FP32","data":[1]}]}',
        b'{"inputs":[{"name":"input","\\u0073hape":[1099511627776],"datatype":"FP32","data":[1.0]}]}',
    ],
    ids=["2^40", "four-dims", "escaped-key"],
)
def test_huge_declared_shape_is_refused_and_triton_survives(
    fuzz_gateway, fuzz_headers, rel_triton, body
) -> None:  # type: ignore[no-untyped-def]
    """Found by the fuzzer: one such request made Triton 2.51 abort, taking every model down."""
    url = fuzz_gateway.url + "/v2/models/tiny_linear/infer"
    problem = {"Content-Type": "application/json", "Accept": "application/problem+json"}
    response = httpx.post(url, content=body, headers={**fuzz_headers, **problem})
    assert response.status_code == 400 and response.json()["field"].startswith("inputs.0."), (
        response.text
    )
    assert rel_triton.running(), "Triton died"
    assert httpx.post(url, json=tiny_request(), headers=fuzz_headers).status_code == 200
