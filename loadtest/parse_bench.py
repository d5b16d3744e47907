"""What the gateway's strict KServe v2 parsing costs: parse and re-encode time per request shape.

Every KServe v2 request is parsed (``gateway.protocol.kserve.parse_rest``) and re-encoded for Triton
(``encode_rest``) instead of being forwarded as received; this prints what that costs, in process,
for bodies as ``tritonclient.http`` builds them, beside what the gateway weighs each body at before
parsing it (``RestBody.work_bytes``) and where it therefore checks it: on the event loop up to
``gateway.service.PARSE_INLINE_WORK``, in a worker thread above.

    python -m loadtest.parse_bench [--repeat 20]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np
import tritonclient.http as http

from gateway.protocol.kserve import RestBody, encode_rest, parse_rest
from gateway.service import PARSE_INLINE_WORK

__all__ = ["main"]


def _body(array: np.ndarray, datatype: str, binary: bool) -> tuple[bytes, str | None]:
    tensor = http.InferInput("x", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    body, json_size = http.InferenceServerClient.generate_request_body([tensor])
    return body, None if json_size is None else str(json_size)


def _shapes() -> dict[str, tuple[bytes, str | None]]:
    rng = np.random.default_rng(0)
    pixels = rng.random((1, 3, 224, 224), dtype=np.float32)
    jpegs = np.array([[b"\xff\xd8\xff" + bytes(28_000)]] * 8, dtype=np.object_)
    texts = np.array([[b"a photo of a cat sitting on a mat"]] * 32, dtype=np.object_)
    return {
        "FP32 1x3x224x224, binary": _body(pixels, "FP32", True),
        "FP32 1x3x224x224, JSON": _body(pixels, "FP32", False),
        "BYTES 8 images of 28 KB, binary": _body(jpegs, "BYTES", True),
        "BYTES 32 texts, JSON": _body(texts, "BYTES", False),
        # The GPU pipeline's input: one encoded image as UINT8 bytes.
        "UINT8 JPEG of 135 KB, binary": _body(
            np.zeros((1, 135_000), dtype=np.uint8), "UINT8", True
        ),
        # Around the inline budget: two of the costliest bodies the event loop takes, one past it.
        "FP32 1,000,000 values, binary": _body(
            rng.random(1_000_000, dtype=np.float32), "FP32", True
        ),
        "FP32 1,000 values, JSON": _body(rng.random(1_000, dtype=np.float32), "FP32", False),
        "BYTES 2,000 empty strings, binary": _body(
            np.array([b""] * 2_000, dtype=np.object_), "BYTES", True
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.parse_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--repeat", type=int, default=20, help="timed repetitions per shape (mean reported)"
    )
    args = parser.parse_args(argv)
    print(
        f"{'request':34} {'body bytes':>11} {'work bytes':>11} {'checked on':>11} {'parse ms':>9} {'encode ms':>10}"
    )
    for name, (body, header_length) in _shapes().items():
        work = RestBody(body, header_length).work_bytes
        where = "event loop" if work <= PARSE_INLINE_WORK else "a thread"
        parse_rest(body, header_length)  # warm
        started = time.perf_counter()
        for _ in range(args.repeat):
            request = parse_rest(body, header_length)
        parsed = (time.perf_counter() - started) / args.repeat
        started = time.perf_counter()
        for _ in range(args.repeat):
            encode_rest(request)
        encoded = (time.perf_counter() - started) / args.repeat
        print(
            f"{name:34} {len(body):>11,} {work:>11,} {where:>11} {parsed * 1000:>9.2f} {encoded * 1000:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
