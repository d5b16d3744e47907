"""Gateway vs direct Triton, over KServe v2 HTTP and gRPC, with the clients users have (tritonclient aio).

Starts its own Triton (the embedded server, on the given repository) and gateway (with its gRPC
entry), then sends the same requests at the same concurrency along four paths: Triton HTTP, gateway
HTTP, Triton gRPC, gateway gRPC. The paths take turns in short rounds, so machine noise hits all of
them alike, and the table quotes each gateway path against the direct path of the same protocol:
throughput ratio and the P50/P99 it adds. Load comes from the platform's one load generator
(:mod:`loadtest.loadgen`); percentiles from :mod:`serving.quantiles`.

    python -m loadtest.clients_bench --repository model_repository --model efficientnet_lite0 \\
        --concurrency 1 8 --duration-s 20

Ratios are what to compare; absolute times depend on the machine (quote them from a GPU host only).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from loadtest.loadgen import LoadRun, LoadSpec, Samples, TritonTarget
from loadtest.loadgen import run as run_specs
from loadtest.options import add_alternating_round_options
from loadtest.scaling_stack import BENCH_TIER
from serving.console import Table, make_console, print_table
from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.quantiles import summarize
from serving.triton_clients import triton_client

__all__ = ["PATHS", "ClientsSettings", "PathFigures", "build_parser", "run", "run_benchmark"]

#: (label, protocol, through the gateway)
PATHS: tuple[tuple[str, str, bool], ...] = (
    ("triton http", "http", False),
    ("gateway http", "http", True),
    ("triton grpc", "grpc", False),
    ("gateway grpc", "grpc", True),
)
DEFAULT_ROUNDS = 4
DEFAULT_WARMUP_S = 1.0


@dataclass(frozen=True)
class PathFigures:
    """One path at one concurrency, over every round."""

    path: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    error_summary: str


def _figures(path: str, concurrency: int, runs: Sequence[LoadRun]) -> PathFigures:
    inside = [
        r.samples.where((r.samples.t1 >= r.window[0]) & (r.samples.t1 <= r.window[1])) for r in runs
    ]
    merged = Samples.concat(inside)
    ok = merged.ok
    seconds = sum(r.window[1] - r.window[0] for r in runs)
    summary = summarize((merged.latency_s[ok] * 1000.0).tolist())
    failing = {s: n for s, n in merged.statuses().items() if s != 200}
    messages = {s: m for r in runs for s, m in r.samples.messages.items()}
    return PathFigures(
        path=path,
        concurrency=concurrency,
        requests=int(ok.sum()),
        errors=int((~ok).sum()),
        seconds=seconds,
        throughput=float(ok.sum()) / seconds if seconds > 0 else 0.0,
        p50_ms=summary.p50 if summary else math.nan,
        p99_ms=summary.p99 if summary else math.nan,
        error_summary="; ".join(
            f"status {s} x{n}: {messages.get(s, '')}" for s, n in failing.items()
        ),
    )


def _sample_inputs(triton_http: str, model: str, batch: int) -> dict[str, np.ndarray]:
    """Random inputs of the model's declared shapes (dynamic axes 1, the batch axis ``batch``)."""
    from tritonclient.utils import triton_to_np_dtype

    client = triton_client(triton_http)
    try:
        metadata, config = client.get_model_metadata(model), client.get_model_config(model)
    finally:
        client.close()
    rng = np.random.default_rng(0)
    arrays = {}
    for spec in metadata["inputs"]:
        shape = [int(d) for d in spec["shape"]]
        if config.get("max_batch_size", 0) > 0:
            shape[0] = batch
        shape = [1 if d < 0 else d for d in shape]
        dtype = np.dtype(triton_to_np_dtype(spec["datatype"]))
        if spec["datatype"] == "BYTES":
            raise SystemExit(
                f"{model} takes BYTES input {spec['name']}: pick a tensor model for this benchmark"
            )
        arrays[spec["name"]] = (
            rng.random(shape) if dtype.kind == "f" else rng.integers(0, 2, shape)
        ).astype(dtype)
    return arrays


@dataclass(frozen=True)
class ClientsSettings:
    """The load on each path: every concurrency for ``duration_s`` measured seconds, split over
    ``rounds`` alternating rounds; ``batch`` rows per request; ``processes`` load generators."""

    concurrencies: Sequence[int]
    duration_s: float
    rounds: int = DEFAULT_ROUNDS
    batch: int = 1
    processes: int = 1


def run_benchmark(repository: Path, model: str, settings: ClientsSettings) -> list[PathFigures]:
    """Start Triton and a gateway, measure the four paths at each concurrency, stop both.

    Returns:
        One :class:`PathFigures` per (concurrency, path), in :data:`PATHS` order.
    """
    concurrencies, duration_s, rounds = settings.concurrencies, settings.duration_s, settings.rounds
    batch, processes = settings.batch, settings.processes
    from gateway.settings import GatewaySettings
    from gateway.tenancy.key_stores import bootstrap_first_key
    from gateway.tenancy.secret_policy import generate_secret
    from serving.launcher import TritonPorts, TritonServer
    from serving.ports import reserve_port
    from serving.processes import child_env

    with (
        tempfile.TemporaryDirectory(prefix="clients-bench-") as tmp,
        TritonServer(repository.resolve(), models=[model], ports=TritonPorts.free()) as triton,
    ):
        http_port, grpc_port = reserve_port(), reserve_port()
        env = {
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_PORT": str(http_port),
            "GATEWAY_GRPC_PORT": str(grpc_port),
            "GATEWAY_TRITON_HTTP_URL": triton.http_url,
            "GATEWAY_KEYS_DB": str(Path(tmp) / "keys.sqlite3"),
            "GATEWAY_TIER_LIMITS": json.dumps(BENCH_TIER),
            "GATEWAY_LOG_LEVEL": "warning",
            "GATEWAY_MAX_IN_FLIGHT_PER_MODEL": str(max(64, 2 * max(concurrencies))),
            # unused here, but the gateway refuses to serve without one
            "GATEWAY_ADMIN_TOKEN": generate_secret(),
        }
        key = bootstrap_first_key(
            GatewaySettings(keys_db=Path(tmp) / "keys.sqlite3"), name="bench", tier="bench"
        )
        gateway = start_gateway_process(
            GatewayLaunch(
                http_port, child_env(env), log_path=Path(tmp) / "gateway.log", ready_timeout_s=60
            )
        )
        try:
            inputs = (_sample_inputs(triton.http_url, model, batch),)
            urls = {
                ("http", False): triton.http_url,
                ("http", True): f"127.0.0.1:{http_port}",
                ("grpc", False): triton.grpc_url,
                ("grpc", True): f"127.0.0.1:{grpc_port}",
            }
            figures: list[PathFigures] = []
            for concurrency in concurrencies:
                per_path: dict[str, list[LoadRun]] = {label: [] for label, _, _ in PATHS}
                for _ in range(rounds):
                    for label, protocol, through in PATHS:
                        headers = {"authorization": f"Bearer {key}"} if through else {}
                        target = TritonTarget(
                            url=urls[(protocol, through)],
                            model=model,
                            inputs=inputs,
                            protocol=protocol,
                            headers=headers,
                            name=label,
                        )
                        # (loadgen's Target protocol declares ``name`` settable; frozen targets read it only)
                        spec = LoadSpec(
                            target=target,
                            concurrency=concurrency,  # type: ignore[arg-type]
                            duration_s=duration_s / rounds,
                            warmup_s=DEFAULT_WARMUP_S,
                            name=label,
                        )
                        per_path[label].extend(run_specs([spec], processes))
                figures.extend(
                    _figures(label, concurrency, per_path[label]) for label, _, _ in PATHS
                )
            return figures
        finally:
            gateway.stop()


def table(
    figures: Sequence[PathFigures], model: str, batch: int, duration_s: float, rounds: int
) -> Table:
    """Each path's figures; gateway rows quote the direct path of the same protocol."""
    result = Table(
        f"Gateway vs direct Triton, tritonclient aio: {model}, batch {batch}",
        (
            "concurrency",
            "path",
            "req/s",
            "P50 ms",
            "P99 ms",
            "vs direct req/s",
            "added P50 ms",
            "added P99 ms",
            "errors",
        ),
        caption=f"{duration_s:g} s per path and concurrency in {rounds} alternating rounds; "
        "percentiles from serving.quantiles (DDSketch, 1% relative error)",
    )
    direct = {(f.concurrency, f.path.split()[1]): f for f in figures if f.path.startswith("triton")}
    for f in figures:
        base = direct[(f.concurrency, f.path.split()[1])]
        through = f is not base
        result.add_row(
            f.concurrency,
            f.path,
            f"{f.throughput:.1f}",
            f"{f.p50_ms:.2f}",
            f"{f.p99_ms:.2f}",
            f"{f.throughput / base.throughput:.2f}" if through and base.throughput else "-",
            f"{f.p50_ms - base.p50_ms:+.2f}" if through else "-",
            f"{f.p99_ms - base.p99_ms:+.2f}" if through else "-",
            f.error_summary or str(f.errors),
        )
    return result


def build_parser() -> argparse.ArgumentParser:
    from inferctl.build_cmd import add_repository_option

    parser = argparse.ArgumentParser(
        description="Gateway vs direct Triton over KServe v2 HTTP and gRPC (tritonclient aio clients): "
        "starts its own Triton and gateway, prints a table (and --json).",
    )
    add_repository_option(parser, "a built model repository")
    parser.add_argument(
        "--model", default="efficientnet_lite0", help="a tensor model in it (default: %(default)s)"
    )
    add_alternating_round_options(
        parser,
        concurrency=[1, 8],
        duration_s=20.0,
        measured="path and concurrency",
        rounds=DEFAULT_ROUNDS,
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="rows per request (default: %(default)s)"
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="load generator processes (default: %(default)s)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the figures as JSON instead of a table"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench clients``: the parsed options in, the exit status out."""
    figures = run_benchmark(
        args.repository,
        args.model,
        ClientsSettings(args.concurrency, args.duration_s, args.rounds, args.batch, args.processes),
    )
    if args.json:
        print(json.dumps([asdict(f) for f in figures], indent=2))
    else:
        print_table(
            table(figures, args.model, args.batch, args.duration_s, args.rounds), make_console()
        )
    return 1 if any(f.requests == 0 for f in figures) else 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("clients"))
