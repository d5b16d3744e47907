"""Hostile KServe v2 bodies in other encodings: the binary tensor extension and compressed bodies."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from collections.abc import Callable, Iterator

from tests.support.hostile_corpus import Hostile, bad_request, binary_body, good_input, raw_body

__all__ = ["binary_cases", "compression_cases"]


def binary_cases(model: str, name: str, datatype: str, dims: list[int]) -> Iterator[Hostile]:
    f = "binary-extension"
    count = 1
    for d in dims:
        count *= d
    size = 4 * count if datatype == "FP32" else 4 + 5
    tail = b"\0" * size if datatype == "FP32" else struct.pack("<I", 5) + b"hello"
    header = {
        "inputs": [
            {
                "name": name,
                "shape": [1, *dims],
                "datatype": datatype,
                "parameters": {"binary_data_size": size},
            }
        ]
    }
    encoded = json.dumps(header).encode()
    cases: list[tuple[str, tuple[Callable[[], bytes], dict[str, str]], str]] = [
        ("short-tail", binary_body(header, tail[:-1]), "binary_data_size"),
        ("long-tail", binary_body(header, tail + b"\0" * 64), "binary_data_size"),
        (
            "header-length-past-body",
            binary_body(header, tail, len(encoded) + len(tail) + 10),
            "Inference-Header-Content-Length",
        ),
        ("header-length-zero", binary_body(header, tail, 0), "Inference-Header-Content-Length"),
        (
            "header-length-negative",
            binary_body(header, tail, -5),
            "Inference-Header-Content-Length",
        ),
        (
            "header-length-hex",
            binary_body(header, tail, hex(len(encoded))),
            "Inference-Header-Content-Length",
        ),
        ("header-length-into-tail", binary_body(header, tail, len(encoded) + 2), "JSON"),
        ("header-length-short", binary_body(header, tail, len(encoded) - 3), "JSON"),
        (
            "header-length-huge",
            binary_body(header, tail, 10**30),
            "Inference-Header-Content-Length",
        ),
        (
            "size-negative",
            binary_body(
                {"inputs": [{**header["inputs"][0], "parameters": {"binary_data_size": -4}}]}, tail
            ),
            "binary_data_size",
        ),
        (
            "size-float",
            binary_body(
                {
                    "inputs": [
                        {**header["inputs"][0], "parameters": {"binary_data_size": float(size)}}
                    ]
                },
                tail,
            ),
            "binary_data_size",
        ),
        (
            "size-2^63",
            binary_body(
                {"inputs": [{**header["inputs"][0], "parameters": {"binary_data_size": 2**63}}]},
                tail,
            ),
            "binary_data_size",
        ),
        ("no-header-length", (raw_body(encoded + tail), {}), "JSON"),
        (
            "unknown-input-parameter",
            binary_body(
                {
                    "inputs": [
                        {
                            **header["inputs"][0],
                            "parameters": {"binary_data_size": size, "offset": 3},
                        }
                    ]
                },
                tail,
            ),
            "parameter",
        ),
    ]
    if datatype == "BYTES":
        cases += [
            (
                "bytes-length-past-end",
                binary_body(header, struct.pack("<I", 2**32 - 1) + b"hello"),
                "BYTES",
            ),
            (
                "bytes-two-elements",
                binary_body(header, struct.pack("<I", 0) + struct.pack("<I", 1) + b"h" + b"\0" * 0),
                "BYTES",
            ),
            ("bytes-no-prefix", binary_body(header, b"hellohell"), "BYTES"),
        ]
    else:
        cases.append(
            (
                "fp32-odd-size",
                binary_body(
                    {
                        "inputs": [
                            {**header["inputs"][0], "parameters": {"binary_data_size": size - 2}}
                        ]
                    },
                    tail[:-2],
                ),
                "needs",
            )
        )
    for label, (body, headers), mention in cases:
        yield bad_request(label, f, model, body, mention, headers=headers)


def compression_cases(model: str, name: str, datatype: str, dims: list[int]) -> Iterator[Hostile]:
    f = "compressed-bodies"
    good = json.dumps({"inputs": [good_input(name, datatype, dims)]}).encode()
    # 16x the suite's 4 MiB cap, in about 64 KB (1,000x): enough to show the cap holds, cheap to build.
    yield bad_request(
        "gzip-bomb-64MB",
        f,
        model,
        lambda: _gzip_zeros(64 << 20),
        "decompresses",
        headers={"Content-Encoding": "gzip"},
        expect=(413,),
    )
    yield bad_request(
        "deflate-bomb-64MB",
        f,
        model,
        lambda: _deflate_zeros(64 << 20),
        "decompresses",
        headers={"Content-Encoding": "deflate"},
        expect=(413,),
    )
    yield bad_request(
        "gzip-duplicate-keys",
        f,
        model,
        lambda: gzip.compress(good[:-1] + b', "inputs": []}'),
        "repeats",
        headers={"Content-Encoding": "gzip"},
    )
    yield bad_request(
        "gzip-deep",
        f,
        model,
        lambda: gzip.compress(b'{"inputs": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
        "levels deep",
        headers={"Content-Encoding": "gzip"},
    )
    yield bad_request(
        "gzip-huge-shape",
        f,
        model,
        lambda: gzip.compress(good.replace(b'"shape": [1', b'"shape": [1099511627776', 1)),
        "shape",
        headers={"Content-Encoding": "gzip"},
    )
    yield bad_request(
        "gzip-truncated",
        f,
        model,
        lambda: gzip.compress(good)[:-9],
        "gzip",
        headers={"Content-Encoding": "gzip"},
    )
    yield bad_request(
        "gzip-trailing",
        f,
        model,
        lambda: gzip.compress(good) + b"MORE",
        "gzip",
        headers={"Content-Encoding": "gzip"},
    )
    yield bad_request(
        "gzip-twice-declared-once",
        f,
        model,
        lambda: gzip.compress(gzip.compress(good)),
        "JSON",
        "UTF-8",
        headers={"Content-Encoding": "gzip"},
    )
    yield bad_request(
        "deflate-raw",
        f,
        model,
        lambda: zlib.compress(good)[2:-4],
        "deflate",
        headers={"Content-Encoding": "deflate"},
    )
    yield bad_request(
        "plain-said-gzip", f, model, raw_body(good), "gzip", headers={"Content-Encoding": "gzip"}
    )
    for encoding in (
        "br",
        "zstd",
        "compress",
        "x-gzip",
        "gzip, gzip",
        "identity, gzip",
        "gzip;q=1",
    ):
        yield bad_request(
            f"encoding-{encoding}",
            f,
            model,
            raw_body(good),
            "Content-Encoding",
            headers={"Content-Encoding": encoding},
            expect=(415,),
        )


def _gzip_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * (1 << 20)
    return b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush()


def _deflate_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9)
    block = b"\0" * (1 << 20)
    return b"".join(packer.compress(block) for _ in range(size >> 20)) + packer.flush()
