"""What the gateway's strict KServe v2 parsing costs: parse and re-encode time per request shape.

Every KServe v2 request is parsed (``gateway.protocol.kserve.parse_rest``) and re-encoded for Triton
(``encode_rest``) instead of being forwarded as received; this prints what that costs, in process,
for bodies as ``tritonclient.http`` builds them, beside what the gateway weighs each body at before
parsing it (``RestBody.work_bytes``) and where it therefore checks it: on the event loop up to
``gateway.tasks.service.PARSE_INLINE_WORK``, in a worker thread above, in a parse process from
``GATEWAY_PARSE_PROCESS_MIN_BYTES`` (by default).

A second table times big JSON bodies (2 and 15 MiB of FP32 values, the free tier's cap and about the
gateway's) three ways: parsed on the event loop, in a thread (``asyncio.to_thread``: the GIL is still
held by the JSON decoder) and in the gateway's parse process (:class:`gateway.protocol.kserve.ParsePool`),
each with the lag a 1 ms ticker on the same event loop saw meanwhile (the largest of each run: the
median and the worst over the runs): what every other request of the process waits. An idle row
(the ticker alone beside a 50 ms sleep) is the machine's own noise.

A third table does the same for OpenAI ``/v1/embeddings`` bodies of about 2 MiB (1,024 token arrays,
as LangChain sends them, or 2,048 texts): decoded and validated on the event loop (what FastAPI does
with it), and decoded in the parse process then validated on the loop (what
:class:`gateway.routes._pooled_json.PooledJsonRoute` does for a body of
``GATEWAY_PARSE_PROCESS_MIN_BYTES`` or more).

    python -m loadtest.parse_bench [--repeat 20] [--big-repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import numpy as np
import tritonclient.http as http

from gateway.http.connection_settings import DEFAULT_PARSE_PROCESS_MIN_BYTES
from gateway.protocol.kserve import ParseLimits, ParsePool, RestBody, encode_rest, parse_rest
from gateway.protocol.rest import EmbeddingsRequest
from gateway.tasks.service import PARSE_INLINE_WORK

__all__ = ["build_parser", "run"]


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


def _big_json(mib: float) -> bytes:
    """A KServe v2 JSON body of about ``mib`` MiB of FP32 values, as ``tritonclient.http`` builds it."""
    rng = np.random.default_rng(1)
    sample, _ = _body(rng.random(10_000, dtype=np.float32), "FP32", False)
    values = int(mib * 1024 * 1024 / (len(sample) / 10_000))
    body, _ = _body(rng.random(values, dtype=np.float32), "FP32", False)
    return body


async def _lagged(work: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Wall ms of ``work`` and the largest lag (ms) a 1 ms ticker on the same loop saw meanwhile."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    ticking = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)  # the ticker is running before the work starts
    started = time.perf_counter()
    await work()
    wall = time.perf_counter() - started
    done = True
    await ticking
    return wall * 1000, worst * 1000


def _embeddings_json(tokens: bool) -> bytes:
    """An OpenAI embeddings body of about 2 MiB: 1,024 token arrays of 300 ids (as LangChain sends
    them), or 2,048 strings of 1,000 characters."""
    rng = np.random.default_rng(2)
    if tokens:
        inputs: list[object] = rng.integers(0, 30_000, size=(1024, 300)).tolist()
    else:
        words = ["cat", "espresso", "mat", "photo", "sitting", "the", "of", "a"]
        inputs = [" ".join(rng.choice(words, 200))[:1000] for _ in range(2048)]
    return json.dumps({"model": "text_embedding", "input": inputs}).encode()


async def _lag_rows(
    label: str, body: bytes, ways: dict[str, Callable[[bytes], Awaitable[object]]], repeat: int
) -> None:
    """One row per way of handling ``body``: median wall ms, median and worst loop lag over ``repeat``."""
    for where, way in ways.items():
        runs = [await _lagged(functools.partial(way, body)) for _ in range(repeat)]
        wall = statistics.median(r[0] for r in runs)
        lags = [r[1] for r in runs]
        print(
            f"{label:12} {len(body) / 2**20:>6.1f} {where:>12} {wall:>9.1f} "
            f"{statistics.median(lags):>12.1f} {max(lags):>7.1f}"
        )


async def _big_table(repeat: int) -> None:
    limits = ParseLimits()
    pool = ParsePool(1)
    pool.start()
    try:
        await pool.parse(_big_json(0.01), None, limits)  # the worker's start is not a parse's cost

        async def inline(body: bytes) -> object:
            return parse_rest(body, None, limits)

        ways: dict[str, Callable[[bytes], Awaitable[object]]] = {
            "(idle 50 ms)": lambda body: asyncio.sleep(0.05),  # the machine's own noise
            "event loop": inline,
            "thread": lambda body: asyncio.to_thread(parse_rest, body, None, limits),
            "process": lambda body: pool.parse(body, None, limits),
        }
        print()
        print(
            f"{'JSON body':12} {'MiB':>6} {'parsed in':>12} {'wall ms':>9} {'loop lag ms':>12} {'worst':>7}"
        )
        for mib in (2, 15):
            await _lag_rows("FP32 values", _big_json(mib), ways, repeat)

        async def fastapi(body: bytes) -> object:  # what FastAPI's handler does on the loop
            return EmbeddingsRequest.model_validate(json.loads(body))

        async def pooled(body: bytes) -> object:  # PooledJsonRoute: decoded away, validated here
            return EmbeddingsRequest.model_validate(await pool.run(json.loads, body))

        print()
        print(
            f"{'embeddings':12} {'MiB':>6} {'decoded in':>12} {'wall ms':>9} {'loop lag ms':>12} {'worst':>7}"
        )
        openai = {"(idle 50 ms)": ways["(idle 50 ms)"], "event loop": fastapi, "process": pooled}
        for label, tokens in (("token ids", True), ("texts", False)):
            await _lag_rows(label, _embeddings_json(tokens), openai, repeat)
    finally:
        pool.close()


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench parse``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=20, help="timed repetitions per shape (mean reported)"
    )
    parser.add_argument(
        "--big-repeat", type=int, default=3, help="timed repetitions per big body and way (0: none)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench parse``: the parsed options in, the exit status out."""
    print(
        f"{'request':34} {'body bytes':>11} {'work bytes':>11} {'checked on':>11} {'parse ms':>9} "
        f"{'encode ms':>10}"
    )
    for name, (body, header_length) in _shapes().items():
        work = RestBody(body, header_length).work_bytes
        where = (
            "event loop"
            if work <= PARSE_INLINE_WORK
            else "a thread"
            if work < DEFAULT_PARSE_PROCESS_MIN_BYTES
            else "a process"
        )
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
            f"{name:34} {len(body):>11,} {work:>11,} {where:>11} {parsed * 1000:>9.2f} "
            f"{encoded * 1000:>10.2f}"
        )
    if args.big_repeat > 0:
        asyncio.run(_big_table(args.big_repeat))
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("parse"))
