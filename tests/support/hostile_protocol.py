"""Hostile HTTP: attacks below the request body, written to raw sockets (sizes, counts, slow
requests, smuggling, garbage)."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.hostile_corpus import Hostile, RawAttempt, raw_body

__all__ = ["protocol_cases"]


def _request(head: bytes, body: bytes = b"") -> Callable[[], bytes]:
    return lambda: head + body


def protocol_cases() -> list[Hostile]:
    """HTTP-level attacks over raw sockets: sizes, counts, slow requests, smuggling, garbage."""
    f = "server-limits"
    infer = (
        b"POST /v2/models/text_embedding/infer HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
        b"Accept: application/problem+json\r\n"
    )
    cases = [
        Hostile(
            f"{f}/header-64MB",
            f,
            RawAttempt(
                lambda: (
                    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "
                    + b"a" * (64 << 20)
                    + b"\r\n\r\n"
                )
            ),
            frozenset({431}),
            ("bytes",),
        ),
        Hostile(
            f"{f}/header-1MB-authorization",
            f,
            RawAttempt(
                _request(
                    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    + b"k" * (1 << 20)
                    + b"\r\n\r\n"
                )
            ),
            frozenset({431}),
            ("bytes",),
        ),
        Hostile(
            f"{f}/url-1MB",
            f,
            RawAttempt(
                _request(b"GET /v2/models/" + b"m" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            ),
            frozenset({431}),
            ("bytes",),
        ),
        Hostile(
            f"{f}/headers-5000",
            f,
            RawAttempt(
                _request(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                    + b"".join(b"X-%d: 1\r\n" % i for i in range(5000))
                    + b"\r\n"
                )
            ),
            frozenset({431}),
            ("header fields", "bytes"),
        ),
        Hostile(
            f"{f}/headers-101",
            f,
            RawAttempt(
                _request(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                    + b"".join(b"X-%d: 1\r\n" % i for i in range(101))
                    + b"\r\n"
                )
            ),
            frozenset({431}),
            ("header fields",),
        ),
        Hostile(
            f"{f}/cookies-30k",
            f,
            RawAttempt(
                _request(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\nCookie: " + b"a=b; " * 7000 + b"\r\n\r\n"
                )
            ),
            frozenset({431}),
            ("bytes",),
        ),
        Hostile(
            f"{f}/silent-connection",
            f,
            RawAttempt(_request(b"")),
            frozenset({408}),
            ("did not arrive",),
        ),
        Hostile(
            f"{f}/half-request-line",
            f,
            RawAttempt(_request(b"GET /v1/mod")),
            frozenset({408}),
            ("did not arrive",),
        ),
        Hostile(
            f"{f}/half-headers",
            f,
            RawAttempt(_request(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")),
            frozenset({408}),
            ("did not arrive",),
        ),
        Hostile(
            f"{f}/half-body",
            f,
            RawAttempt(_request(infer + b"Content-Length: 5000\r\n\r\n", b'{"inputs": [')),
            frozenset({408}),
            ("body did not arrive",),
        ),
        Hostile(
            f"{f}/half-chunked-body",
            f,
            RawAttempt(_request(infer + b"Transfer-Encoding: chunked\r\n\r\n", b'10\r\n{"inputs"')),
            frozenset({408}),
            ("body did not arrive",),
        ),
    ]
    p = "http-protocol"
    for label, data, mention in (
        (
            "garbage-request-line",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n",
            "invalid",
        ),
        ("bad-method", b"G\x00T /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "invalid"),
        ("nul-in-header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", "invalid"),
        ("space-before-colon", b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n", "invalid"),
        ("obs-fold", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  folded\r\n\r\n", "invalid"),
        (
            "content-length-twice",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 20\r\n\r\nx",
            "invalid",
        ),
        (
            "content-length-negative",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            "invalid",
        ),
        (
            "content-length-and-chunked",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n0\r\n\r\nGET /admin/keys HTTP/1.1\r\n\r\n",
            "invalid",
        ),
        (
            "chunk-size-huge",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            "invalid",
        ),
        (
            "chunk-size-garbage",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
            "invalid",
        ),
        ("lf-only-lines", b"GET /healthz HTTP/1.1\nHost: x\n\n", "invalid"),
    ):
        cases.append(
            Hostile(f"{p}/{label}", p, RawAttempt(raw_body(data)), frozenset({400}), (mention,))
        )
    # llhttp reads an HTTP/0.9 request line: it must still meet authentication.
    cases.append(
        Hostile(
            f"{p}/http-0.9-admin",
            p,
            RawAttempt(raw_body(b"GET /admin/keys\r\n\r\n")),
            frozenset({401}),
            ("admin",),
        )
    )
    cases.append(
        Hostile(
            f"{p}/chunked-body-over-cap",
            p,
            RawAttempt(
                _request(
                    infer + b"Transfer-Encoding: chunked\r\n\r\n",
                    b"".join(b"10000\r\n" + b" " * 0x10000 + b"\r\n" for _ in range(80))
                    + b"0\r\n\r\n",
                )
            ),
            frozenset({413}),
            ("larger than the limit",),
        )
    )
    cases.append(
        Hostile(
            f"{p}/declared-body-over-cap",
            p,
            RawAttempt(_request(infer + b"Content-Length: 99999999999\r\n\r\n")),
            frozenset({413}),
            ("larger than the limit",),
        )
    )
    return cases
