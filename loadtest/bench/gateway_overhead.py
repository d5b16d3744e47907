"""What the gateway adds over direct Triton: the same requests at the same concurrency, both paths
interleaved in ABBA rounds within one run so machine noise hits both alike, beside the load
generator's own capacity (the same client against an instant twin of the model).

Prints P50/P99 for both paths, the latency the gateway adds and the throughput ratio. Numbers depend
on the machine; the ratios are what to compare.

    inferctl bench gateway --triton-url 127.0.0.1:8000 --gateway-url http://127.0.0.1:8080 \\
        --model efficientnet_lite0 --concurrency 8 --duration-s 20      # key from GATEWAY_API_KEY
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np

from loadtest.loadgen import (
    LoadResult,
    LoadRun,
    LoadSpec,
    TritonTarget,
    instant_twin,
    merge_runs,
    twin_target,
)
from loadtest.loadgen import run as run_specs
from loadtest.loadgen.capacity import measure_capacity
from loadtest.registry import UsageError
from serving.triton_clients import triton_client

__all__ = ["OverheadResult", "OverheadSettings", "build_parser", "run", "run_overhead"]

DEFAULT_ROUNDS = 4
DEFAULT_WARMUP_S = 1.0


@dataclass(frozen=True)
class OverheadResult:
    """Both paths' figures and the client's capacity (requests/s) with the same settings."""

    model: str
    concurrency: int
    direct: LoadResult
    gateway: LoadResult
    capacity: float

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
            "added_p50_ms": self.added_p50_ms,
            "added_p99_ms": self.added_p99_ms,
            "throughput_ratio": self.throughput_ratio,
        }


def zero_inputs(triton_url: str, model: str) -> dict[str, np.ndarray]:
    """Zeros of the model's input shapes, batch 1, from its metadata."""
    from tritonclient.utils import triton_to_np_dtype

    client = triton_client(triton_url)
    try:
        metadata = client.get_model_metadata(model)
    finally:
        client.close()
    inputs = {}
    for spec in metadata["inputs"]:
        if spec["datatype"] == "BYTES":
            raise ValueError(
                f"model {model!r} takes BYTES input {spec['name']!r}; pass --inputs FILE.npz"
            )
        shape = [1 if d < 0 else d for d in spec["shape"]]
        inputs[spec["name"]] = np.zeros(shape, dtype=triton_to_np_dtype(spec["datatype"]))
    return inputs


@dataclass(frozen=True)
class OverheadSettings:
    """How :func:`run_overhead` drives both paths.

    Attributes:
        concurrency: requests in flight on each path.
        duration_s: measured time, split evenly between the paths over ``rounds`` ABBA rounds.
        rounds: ABBA alternations (drift in the machine spreads over both paths).
        processes: load-generator processes.
        inputs: one request's tensors; zeros of the model's input shapes when ``None``.
        binary: KServe v2 binary tensors (``False``: JSON).
    """

    concurrency: int = 8
    duration_s: float = 20.0
    rounds: int = DEFAULT_ROUNDS
    processes: int = 1
    inputs: Mapping[str, np.ndarray] | None = None
    binary: bool = True


def run_overhead(
    triton_url: str,
    gateway_url: str,
    api_key: str,
    model: str,
    settings: OverheadSettings = OverheadSettings(),
) -> OverheadResult:
    """Measure what the gateway adds over direct Triton, in one run.

    Args:
        triton_url: Triton's HTTP ``host:port`` (explicit model control: the capacity twin is loaded).
        gateway_url: the gateway's base URL (``http://host:port``).
        api_key: a key whose tier will not rate-limit the run.
        model: the model both paths call.
        settings: how the paths are driven.
    """
    inputs, binary = settings.inputs, settings.binary
    concurrency, duration_s = settings.concurrency, settings.duration_s
    rounds, processes = settings.rounds, settings.processes
    request = dict(inputs) if inputs is not None else zero_inputs(triton_url, model)
    direct = TritonTarget(
        url=triton_url, model=model, inputs=(request,), binary=binary, name="direct"
    )
    gateway = replace(
        direct,
        url=gateway_url.removeprefix("http://").rstrip("/"),
        headers={"Authorization": f"Bearer {api_key}"},
        name="gateway",
    )
    slice_s = duration_s / (2 * rounds)
    specs = {
        target.name: LoadSpec(target=target, concurrency=concurrency, duration_s=slice_s)
        for target in (direct, gateway)
    }
    for spec in specs.values():  # warm connections, caches and the dynamic batcher
        run_specs([replace(spec, duration_s=DEFAULT_WARMUP_S)], processes)
    collected: dict[str, list[LoadRun]] = {name: [] for name in specs}
    for index in range(rounds):
        order = (
            list(specs) if index % 2 == 0 else list(reversed(specs))
        )  # ABBA: drift favours neither
        for name in order:
            collected[name].extend(run_specs([specs[name]], processes))
    with instant_twin(triton_url, model) as twin:
        capacity = measure_capacity(specs["direct"], twin_target(direct, twin), processes)
    return OverheadResult(
        model,
        concurrency,
        merge_runs(collected["direct"]),
        merge_runs(collected["gateway"]),
        capacity.throughput,
    )


def print_result(result: OverheadResult) -> None:
    """Print the result as a rich table."""
    from rich.console import Console
    from rich.table import Table

    d, g = result.direct, result.gateway
    table = Table(
        title=f"Gateway overhead: {result.model}, concurrency {result.concurrency}, "
        f"{d.duration_s + g.duration_s:.0f} s measured"
    )
    for column, justify in (
        ("", "left"),
        ("direct Triton", "right"),
        ("via gateway", "right"),
        ("gateway adds", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    table.add_row(
        "P50 ms", f"{d.p50_ms:.2f}", f"{g.p50_ms:.2f}", f"{result.added_p50_ms:+.2f} ms (goal <= 1)"
    )
    table.add_row(
        "P99 ms", f"{d.p99_ms:.2f}", f"{g.p99_ms:.2f}", f"{result.added_p99_ms:+.2f} ms (goal <= 3)"
    )
    table.add_row(
        "mean ms", f"{d.mean_ms:.2f}", f"{g.mean_ms:.2f}", f"{g.mean_ms - d.mean_ms:+.2f} ms"
    )
    table.add_row(
        "throughput req/s",
        f"{d.throughput:.1f}",
        f"{g.throughput:.1f}",
        f"ratio {result.throughput_ratio:.1%} (goal >= 80%)",
    )
    table.add_row(
        "requests / errors", f"{d.requests} / {d.errors}", f"{g.requests} / {g.errors}", ""
    )
    table.add_row(
        "client capacity req/s",
        f"{result.capacity:.1f}",
        "",
        f"direct uses {d.throughput / result.capacity:.0%}",
    )
    Console().print(table)
    for path in (d, g):
        if path.errors:
            Console().print(f"[red]{path.name}: {path.error_summary()}[/red]", soft_wrap=True)


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench gateway``'s options."""
    parser = argparse.ArgumentParser(
        description="Gateway overhead over direct Triton: P50/P99 added and throughput ratio at equal "
        "concurrency, beside the load generator's capacity. Exits 1 when any request failed.",
    )
    parser.add_argument("--triton-url", default="127.0.0.1:8000", help="Triton HTTP host:port")
    parser.add_argument("--gateway-url", default="http://127.0.0.1:8080", help="gateway base URL")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("GATEWAY_API_KEY"),
        help="a key whose tier will not throttle the run (default: $GATEWAY_API_KEY; "
        "prefer the environment, argv is visible to ps)",
    )
    parser.add_argument("--model", required=True, help="a model both paths call")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--duration-s", type=float, default=20.0, help="measured seconds, both paths together"
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="ABBA alternations")
    parser.add_argument("--processes", type=int, default=1, help="load-generator processes")
    parser.add_argument(
        "--inputs", help=".npz file of one request's tensors by input name (default: zeros)"
    )
    parser.add_argument(
        "--json-tensors", action="store_true", help="send JSON tensors instead of binary"
    )
    parser.add_argument(
        "--json", dest="json_out", help="also write the result as JSON to this file"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench gateway``: the parsed options in, the exit status out."""
    if not args.api_key:
        raise UsageError("an API key is needed: --api-key or GATEWAY_API_KEY")
    inputs = dict(np.load(args.inputs)) if args.inputs else None
    result = run_overhead(
        args.triton_url,
        args.gateway_url,
        args.api_key,
        args.model,
        OverheadSettings(
            concurrency=args.concurrency,
            duration_s=args.duration_s,
            rounds=args.rounds,
            processes=args.processes,
            inputs=inputs,
            binary=not args.json_tensors,
        ),
    )
    print_result(result)
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(result.as_dict(), handle, indent=2, default=float)
    return 0 if result.gateway.errors == 0 and result.direct.errors == 0 else 1


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("gateway"))
