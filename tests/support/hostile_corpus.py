"""The hostile-input corpus: every class of request that once hurt the platform, plus variants.

Each :class:`Hostile` says what to send (an :class:`HttpAttempt` through httpx, or a
:class:`RawAttempt` written to a socket), which statuses are acceptable, and which words the answer
must contain to name the problem. Bodies are built lazily (a 64 MB header is only made when sent).
``family`` names the class, after issue 12's list; ``owner`` names the part of the platform whose
check answers the case when that is not the gateway's request parsing (the suite marks a case as an
expected failure, with this reason, while that fix has not landed).

This module holds the case types and the small builders every family uses. The families:
:mod:`tests.support.hostile_kserve` (KServe v2 JSON bodies), :mod:`tests.support.hostile_encoded`
(binary-extension and compressed bodies), :mod:`tests.support.hostile_protocol` (HTTP-protocol
attacks over raw sockets), :mod:`tests.support.hostile_media` (images and multipart uploads),
:mod:`tests.support.hostile_tasks` (embedding texts, image-generation parameters),
:mod:`tests.support.hostile_api` (model names, reserved paths, admin inputs, tenants' statistics,
the unknown-name flood) and :mod:`tests.support.hostile_grpc` (the gRPC entry).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLIENTS_DIMENSIONS",
    "INTERNALS",
    "KSERVE_TARGETS",
    "SERVING",
    "TENANCY_ADMIN",
    "TENANCY_LIMITS",
    "TENANCY_NAMES",
    "GrpcAttempt",
    "Hostile",
    "HttpAttempt",
    "RawAttempt",
    "bad_request",
    "binary_body",
    "good_input",
    "infer_attempt",
    "json_body",
    "json_bytes",
    "raw_body",
]

#: owners of cases whose fix belongs to another part of the platform (see ``Hostile.owner``)
SERVING = (
    "serving: image decode limits (aspect ratio, resize target, source pixels) in image_preprocess"
)
TENANCY_NAMES = "tenancy: unknown and reserved model names refused before any state"
TENANCY_LIMITS = "tenancy: request limits from serving.limits enforced by the gateway"
TENANCY_ADMIN = "tenancy: admin inputs validated (traffic weights, versions, key scopes)"
CLIENTS_DIMENSIONS = "clients: `dimensions` honoured where the model supports it, else a clear 400"
#: what no answer may show: tracebacks, source files, library internals, memory addresses
INTERNALS = ("Traceback", ".py", "PngImagePlugin", "PIL.", "<_io.", " at 0x", "site-packages")

#: the models the hostile gateway serves, with one input each: (model, input, datatype, per-item dims)
KSERVE_TARGETS = (
    ("efficientnet_lite0", "input", "FP32", [3, 224, 224]),
    ("image_classifier", "IMAGE", "BYTES", [1]),
    ("text_embedding", "TEXT", "BYTES", [1]),
)


@dataclass(frozen=True)
class HttpAttempt:
    """A request sent through httpx (``credential``: ``client``, ``other`` (a second tenant),
    ``admin`` or ``none``).

    ``body`` makes the body, or the body plus headers that depend on it.
    """

    method: str
    path: str
    body: Callable[[], bytes | tuple[bytes, dict[str, str]]] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    files: Callable[[], list[tuple[str, tuple[str, bytes, str]]]] | None = None
    credential: str = "client"


@dataclass(frozen=True)
class RawAttempt:
    """Bytes written to a fresh connection as they are; the answer is read until the server closes.

    The client's ``Authorization`` value is spliced in where ``{auth}`` appears.
    """

    data: Callable[[], bytes]


@dataclass(frozen=True)
class GrpcAttempt:
    """One call on the gateway's KServe v2 gRPC entry: ``method`` of the service and its request."""

    method: str
    request: Callable[[], Any]
    credential: str = "client"


@dataclass(frozen=True)
class Hostile:
    """One hostile input and what a safe answer to it is."""

    id: str
    family: str
    attempt: HttpAttempt | RawAttempt | GrpcAttempt
    expect: frozenset[int]
    mentions: tuple[str, ...] = ()
    owner: str | None = None
    forbid: tuple[str, ...] = ()  # texts the answer must not contain (another tenant's data, ...)


def json_bytes(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def json_body(doc: Any) -> Callable[[], bytes]:
    return lambda: json_bytes(doc)


def raw_body(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def good_input(name: str, datatype: str, dims: list[int]) -> dict[str, Any]:
    count = 1
    for d in dims:
        count *= d
    data: list[Any] = ["hello"] * count if datatype == "BYTES" else [0.0] * count
    return {"name": name, "shape": [1, *dims], "datatype": datatype, "data": data}


def infer_attempt(
    model: str, body: Callable[[], bytes], headers: Mapping[str, str] | None = None
) -> HttpAttempt:
    return HttpAttempt("POST", f"/v2/models/{model}/infer", body, dict(headers or {}))


def bad_request(
    case_id: str,
    family: str,
    model: str,
    body: Callable[[], bytes],
    *mentions: str,
    headers: Mapping[str, str] | None = None,
    expect: tuple[int, ...] = (400,),
) -> Hostile:
    return Hostile(
        f"{family}/{model}/{case_id}",
        family,
        infer_attempt(model, body, headers),
        frozenset(expect),
        mentions,
    )


def binary_body(
    header: dict[str, Any], tail: bytes, declared: int | str | None = None
) -> tuple[Callable[[], bytes], dict[str, str]]:
    encoded = json.dumps(header).encode()
    length = str(len(encoded) if declared is None else declared)
    return raw_body(encoded + tail), {"Inference-Header-Content-Length": length}
