"""Hostile inputs for the gateway's own APIs: model names, reserved Triton paths, admin inputs,
tenants' statistics and the unknown-name flood; :func:`api_cases` also gathers the image, upload,
embedding and image-generation families (:mod:`tests.support.hostile_media`,
:mod:`tests.support.hostile_tasks`).

See :mod:`tests.support.hostile_corpus` for the case types. Placeholders resolved when a case is
sent: ``{other_key_id}`` (another tenant's key id) in ``forbid``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache

from tests.support.hostile_corpus import (
    INTERNALS,
    TENANCY_ADMIN,
    TENANCY_NAMES,
    Hostile,
    HttpAttempt,
    json_body,
    json_bytes,
    raw_body,
)
from tests.support.hostile_media import image_cases, upload_cases
from tests.support.hostile_tasks import embedding_cases, generation_cases

__all__ = ["api_cases", "flood_names"]


def _reserved_cases() -> Iterator[Hostile]:
    f = "reserved-paths"
    stats = ("inference_stats", "model_stats", "execution_count")
    for method, path, owner in (
        ("GET", "/v2/models/stats", TENANCY_NAMES),
        ("GET", "/v2/models/stats/ready", TENANCY_NAMES),
        ("GET", "/v2/models/stats/config", TENANCY_NAMES),
        ("POST", "/v2/models/stats/infer", TENANCY_NAMES),
        ("GET", "/v2/models/stats/versions/1", TENANCY_NAMES),
        ("GET", "/v2/models/efficientnet_lite0/stats", None),
        ("GET", "/v2/models/ready", TENANCY_NAMES),
        ("GET", "/v2/models/config", TENANCY_NAMES),
        ("GET", "/v2/repository/index", None),
        ("POST", "/v2/repository/index", None),
        ("POST", "/v2/repository/models/efficientnet_lite0/unload", None),
        ("POST", "/v2/repository/models/efficientnet_lite0/load", None),
        ("GET", "/v2/systemsharedmemory/status", None),
        ("POST", "/v2/systemsharedmemory/region/r/register", None),
        ("POST", "/v2/cudasharedmemory/region/r/register", None),
        ("GET", "/v2/trace/setting", None),
        ("POST", "/v2/trace/setting", None),
        ("POST", "/v2/logging", None),
        ("GET", "/v2/models/efficientnet_lite0/trace/setting", None),
        ("POST", "/v2/models/efficientnet_lite0/generate", None),
        ("GET", "/v2/models/..%2F..%2Fadmin%2Fkeys", TENANCY_NAMES),
        ("GET", "/v2/models/%2e%2e", TENANCY_NAMES),
        ("GET", "/v2/models/efficientnet_lite0%00", TENANCY_NAMES),
        ("GET", "/v2/models/a%20b", TENANCY_NAMES),
        ("GET", "/v2/models/" + "n" * 2000, TENANCY_NAMES),
        ("GET", "/v2/models/" + "n" * 10_000, TENANCY_NAMES),  # longer than Triton reads a URL
        ("GET", "/v2/models/%C3%BCn%C3%AFcode", TENANCY_NAMES),
    ):
        label = path if len(path) <= 60 else f"{path[:24]}...({len(path)} chars)"
        yield Hostile(
            f"{f}/{method}{label}",
            f,
            HttpAttempt(method, path, raw_body(b"{}") if method == "POST" else None),
            frozenset({400, 403, 404, 405}),
            (),
            owner,
            stats + INTERNALS,
        )


def _admin_cases() -> Iterator[Hostile]:
    f = "admin-inputs"
    path = "/admin/traffic/efficientnet_lite0"
    for label, body, expect, owner in (
        ("weight-1e308", b'{"versions": {"1": 1e308}}', (400, 422), TENANCY_ADMIN),
        ("weight-negative", b'{"versions": {"1": -1}}', (400, 422), TENANCY_ADMIN),
        ("weight-nan", b'{"versions": {"1": NaN}}', (400, 422), TENANCY_ADMIN),
        ("weight-infinity", b'{"versions": {"1": Infinity}}', (400, 422), TENANCY_ADMIN),
        ("weights-all-zero", b'{"versions": {"1": 0}}', (400, 422), TENANCY_ADMIN),
        ("version-unloaded", b'{"versions": {"99": 1}}', (400, 404, 409, 422), TENANCY_ADMIN),
        (
            "version-unloaded-beside-loaded",
            b'{"versions": {"1": 1, "7": 1}}',
            (400, 404, 409, 422),
            TENANCY_ADMIN,
        ),
        ("version-word", b'{"versions": {"latest": 1}}', (400, 404, 409, 422), TENANCY_ADMIN),
        (
            "versions-10000",
            json_bytes({"versions": {str(i): 1 for i in range(10_000)}}),
            (400, 404, 409, 422),
            TENANCY_ADMIN,
        ),
        ("versions-empty", b'{"versions": {}}', (400, 422), None),
        ("versions-list", b'{"versions": [1]}', (400, 422), None),
    ):
        yield Hostile(
            f"{f}/traffic-{label}",
            f,
            HttpAttempt(
                "PUT",
                path,
                raw_body(body),
                {"Content-Type": "application/json"},
                credential="admin",
            ),
            frozenset(expect),
            ("version", "weight"),
            owner,
            INTERNALS,
        )
    for label, target, expect, owner in (
        ("model-unknown", "/admin/traffic/no_such_model", (400, 404), TENANCY_ADMIN),
        ("model-reserved", "/admin/traffic/stats", (400, 404), TENANCY_ADMIN),
        ("model-long", "/admin/traffic/" + "m" * 1000, (400, 404), TENANCY_ADMIN),
    ):
        yield Hostile(
            f"{f}/traffic-{label}",
            f,
            HttpAttempt(
                "PUT",
                target,
                raw_body(b'{"versions": {"1": 1}}'),
                {"Content-Type": "application/json"},
                credential="admin",
            ),
            frozenset(expect),
            ("model",),
            owner,
            INTERNALS,
        )
    keys: list[tuple[str, dict[str, object], str | None]] = [
        ("key-tier-unknown", {"name": "x", "scopes": ["*"], "tier": "god"}, None),
        ("key-name-1MB", {"name": "n" * (1 << 20), "scopes": ["*"], "tier": "free"}, None),
        (
            "key-scopes-100k",
            {"name": "x", "scopes": [f"m{i}" for i in range(100_000)], "tier": "free"},
            TENANCY_ADMIN,
        ),
        ("key-scopes-string", {"name": "x", "scopes": "*", "tier": "free"}, None),
    ]
    for label, doc, owner in keys:
        yield Hostile(
            f"{f}/{label}",
            f,
            HttpAttempt("POST", "/admin/keys", json_body(doc), credential="admin"),
            frozenset({400, 413, 422}),
            ("tier", "name", "scopes", "body"),
            owner,
            INTERNALS,
        )
    yield Hostile(
        f"{f}/key-rotate-traversal",
        f,
        HttpAttempt("POST", "/admin/keys/..%2F..%2Fetc/rotate", credential="admin"),
        frozenset({400, 404}),
        (),
        None,
        INTERNALS,
    )
    yield Hostile(
        f"{f}/client-key-on-admin",
        f,
        HttpAttempt("GET", "/admin/keys"),
        frozenset({401, 403}),
        ("admin",),
    )


def _disclosure_cases() -> Iterator[Hostile]:
    f = "tenant-disclosure"
    yield Hostile(
        f"{f}/stats-as-other-client",
        f,
        HttpAttempt("GET", "/v1/stats", credential="other"),
        frozenset({200}),
        (),
        None,
        ("{other_key_id}",),
    )
    yield Hostile(
        f"{f}/stats-query-client",
        f,
        HttpAttempt("GET", "/v1/stats?client={other_key_id}", credential="other"),
        frozenset({200, 400, 403}),
        (),
        None,
        ("{other_key_id}",),
    )
    yield Hostile(
        f"{f}/metrics-anonymous",
        f,
        HttpAttempt("GET", "/metrics", credential="none"),
        frozenset({401}),
        ("credential", "token"),
    )
    yield Hostile(
        f"{f}/metrics-client-key",
        f,
        HttpAttempt("GET", "/metrics", credential="other"),
        frozenset({401, 403}),
        ("credential", "token", "metrics"),
    )
    yield Hostile(
        f"{f}/stats-anonymous",
        f,
        HttpAttempt("GET", "/v1/stats", credential="none"),
        frozenset({401}),
        ("credential",),
    )


def flood_names(count: int) -> list[str]:
    """Distinct model names nobody serves, as a flooding client would make them up."""
    return [f"made_up_model_{i:04d}" for i in range(count)]


def _flood_cases() -> Iterator[Hostile]:
    f = "unknown-model-flood"
    body = raw_body(
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        ).encode()
    )
    routes = (
        lambda n: HttpAttempt("POST", f"/v2/models/{n}/infer", body),
        lambda n: HttpAttempt("POST", f"/v2/models/{n}/versions/1/infer", body),
        lambda n: HttpAttempt("GET", f"/v2/models/{n}"),
        lambda n: HttpAttempt("GET", f"/v2/models/{n}/ready"),
        lambda n: HttpAttempt("POST", "/v1/embeddings", json_body({"model": n, "input": "x"})),
    )
    for i, name in enumerate(flood_names(50)):
        yield Hostile(f"{f}/{name}", f, routes[i % len(routes)](name), frozenset({404}), (name,))


@cache
def api_cases() -> tuple[Hostile, ...]:
    """Every API-level hostile case (built lazily: bodies are made when sent)."""
    groups = (
        image_cases,
        embedding_cases,
        generation_cases,
        _reserved_cases,
        _admin_cases,
        _disclosure_cases,
        upload_cases,
        _flood_cases,
    )
    return tuple(case for group in groups for case in group())
