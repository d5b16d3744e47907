"""Gateway overhead benchmark: the same requests, at the same concurrency, direct to Triton and via
the gateway, interleaved in rounds within one run so machine noise hits both sides alike.

Prints P50/P99 for both paths, the latency the gateway adds, and the throughput ratio. Not a test:
numbers depend on the machine; the ratios are what to compare.

    python -m gateway.bench --triton-url 127.0.0.1:8000 --gateway-url http://127.0.0.1:8080 \\
        --api-key gk_... --model efficientnet_lite0 --concurrency 8 --duration-s 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import aiohttp

__all__ = ["BenchmarkResult", "PathResult", "main", "run_overhead_benchmark"]


DEFAULT_ROUNDS = 4
DEFAULT_WARMUP_S = 1.0


@dataclass(frozen=True)
class PathResult:
    """One path's figures (direct or via the gateway)."""

    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_ms: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class BenchmarkResult:
    """The benchmark's outcome."""

    model: str
    concurrency: int
    duration_s: float
    direct: PathResult
    gateway: PathResult

    @property
    def added_p50_ms(self) -> float:
        return self.gateway.p50_ms - self.direct.p50_ms

    @property
    def added_p99_ms(self) -> float:
        return self.gateway.p99_ms - self.direct.p99_ms

    @property
    def throughput_ratio(self) -> float:
        return self.gateway.throughput / self.direct.throughput if self.direct.throughput else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "direct_throughput_rps": self.direct.throughput,
            "gateway_throughput_rps": self.gateway.throughput,
            "added_p50_ms": self.added_p50_ms,
            "added_p99_ms": self.added_p99_ms,
            "throughput_ratio": self.throughput_ratio,
        }


def _rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1] if ordered else float("nan")


async def _default_payload(session: aiohttp.ClientSession, triton_url: str, model: str) -> bytes:
    """A zero-filled KServe v2 request, batch 1, built from the model's metadata."""
    async with session.get(f"http://{triton_url}/v2/models/{model}") as response:
        if response.status != 200:
            raise SystemExit(f"Triton has no model '{model}': {await response.text()}")
        meta = await response.json()
    inputs = []
    for spec in meta["inputs"]:
        if spec["datatype"] == "BYTES":
            raise SystemExit(f"model '{model}' takes BYTES input '{spec['name']}'; pass --payload FILE")
        shape = [1 if d < 0 else d for d in spec["shape"]]
        inputs.append(
            {
                "name": spec["name"],
                "shape": shape,
                "datatype": spec["datatype"],
                "data": [0] * math.prod(shape),
            }
        )
    return json.dumps({"inputs": inputs}).encode()


async def _drive(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    concurrency: int,
    seconds: float,
) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                errors += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors, time.perf_counter() - began


async def _run(
    triton_url: str,
    gateway_url: str,
    api_key: str,
    model: str,
    concurrency: int,
    duration_s: float,
    payload: bytes | None,
    rounds: int,
) -> BenchmarkResult:
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        body = payload or await _default_payload(session, triton_url, model)
        # identity: neither side should spend time compressing responses for the benchmark
        base = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        paths = {
            "direct": (f"http://{triton_url}/v2/models/{model}/infer", base),
            "gateway": (
                f"{gateway_url.rstrip('/')}/v2/models/{model}/infer",
                {**base, "Authorization": f"Bearer {api_key}"},
            ),
        }
        for url, headers in paths.values():  # warm connections, caches and the dynamic batcher
            await _drive(session, url, body, headers, concurrency, DEFAULT_WARMUP_S)
        collected: dict[str, tuple[list[float], int, float]] = {name: ([], 0, 0.0) for name in paths}
        slice_s = duration_s / (2 * rounds)
        for index in range(rounds):
            # ABBA order: alternate which path goes first so drift favours neither.
            order = list(paths) if index % 2 == 0 else list(reversed(paths))
            for name in order:
                url, headers = paths[name]
                lat, err, took = await _drive(session, url, body, headers, concurrency, slice_s)
                old = collected[name]
                collected[name] = (old[0] + lat, old[1] + err, old[2] + took)

    def summarise(name: str) -> PathResult:
        lat, err, took = collected[name]
        mean = sum(lat) / len(lat) if lat else float("nan")
        return PathResult(len(lat), err, took, _rank(lat, 0.50), _rank(lat, 0.99), mean)

    return BenchmarkResult(model, concurrency, duration_s, summarise("direct"), summarise("gateway"))


def print_result(result: BenchmarkResult) -> None:
    """Print the result as a rich table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Gateway overhead: {result.model}, concurrency {result.concurrency}, {result.duration_s:g} s"
    )
    table.add_column("")
    table.add_column("direct Triton", justify="right")
    table.add_column("via gateway", justify="right")
    table.add_column("gateway adds", justify="right")
    d, g = result.direct, result.gateway
    table.add_row(
        "P50 ms", f"{d.p50_ms:.2f}", f"{g.p50_ms:.2f}", f"{result.added_p50_ms:+.2f} ms (goal <= 1)"
    )
    table.add_row(
        "P99 ms", f"{d.p99_ms:.2f}", f"{g.p99_ms:.2f}", f"{result.added_p99_ms:+.2f} ms (goal <= 3)"
    )
    table.add_row("mean ms", f"{d.mean_ms:.2f}", f"{g.mean_ms:.2f}", f"{g.mean_ms - d.mean_ms:+.2f} ms")
    table.add_row(
        "throughput req/s",
        f"{d.throughput:.1f}",
        f"{g.throughput:.1f}",
        f"ratio {result.throughput_ratio:.1%} (goal >= 80%)",
    )
    table.add_row("requests / errors", f"{d.requests} / {d.errors}", f"{g.requests} / {g.errors}", "")
    Console().print(table)


def run_overhead_benchmark(
    triton_url: str,
    gateway_url: str,
    api_key: str,
    model: str,
    concurrency: int = 8,
    duration_s: float = 20.0,
    *,
    payload: bytes | None = None,
    rounds: int = DEFAULT_ROUNDS,
    show: bool = True,
) -> BenchmarkResult:
    """Measure what the gateway adds over direct Triton, in one run.

    Args:
        triton_url: Triton's HTTP ``host:port``.
        gateway_url: the gateway's base URL (``http://host:port``).
        api_key: a key whose tier will not rate-limit the run.
        model: the model both paths call.
        concurrency: concurrent requests on each path (paths run one at a time).
        duration_s: measured time, split evenly between the paths over ``rounds`` ABBA rounds.
        payload: a KServe v2 JSON body; zeros of the model's input shapes when ``None``.
        rounds: how many alternations.
        show: print the rich table.

    Returns:
        The figures; see :class:`BenchmarkResult`.
    """
    result = asyncio.run(
        _run(triton_url, gateway_url, api_key, model, concurrency, duration_s, payload, rounds)
    )
    if show:
        print_result(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.bench``."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.bench",
        description="Gateway overhead over direct Triton: P50/P99 added and throughput ratio at equal concurrency.",
    )
    parser.add_argument("--triton-url", default="127.0.0.1:8000", help="Triton HTTP host:port")
    parser.add_argument("--gateway-url", default="http://127.0.0.1:8080", help="gateway base URL")
    parser.add_argument(
        "--api-key", required=True, help="an API key with a tier that will not throttle the run"
    )
    parser.add_argument("--model", required=True, help="a model both paths call")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--duration-s", type=float, default=20.0, help="measured seconds, both paths together"
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="ABBA alternations")
    parser.add_argument("--payload", help="file with a KServe v2 JSON request body (default: zeros)")
    parser.add_argument("--json", dest="json_out", help="also write the result as JSON to this file")
    args = parser.parse_args(argv)
    payload = open(args.payload, "rb").read() if args.payload else None
    result = run_overhead_benchmark(
        args.triton_url,
        args.gateway_url,
        args.api_key,
        args.model,
        args.concurrency,
        args.duration_s,
        payload=payload,
        rounds=args.rounds,
    )
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(result.as_dict(), handle, indent=2)
    return 0 if result.gateway.errors == 0 and result.direct.errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
