"""Where the gateway's CPU goes per request, on the isolation benchmark's request path.

``python -m loadtest.gateway_profile`` starts the isolation benchmark's platform
(:func:`loadtest.isolation_stack.platform`: the real Triton with the fixed-service-time model, the gateway
as ``inferctl up`` starts it) and drives one path with the platform's load generator:

- ``admitted``: the protected enterprise key's tiny KServe v2 JSON request in a closed loop (what
  ``gateway_cpu_ms_per_request`` of the benchmark measures);
- ``refused``: a free key sending the same request as fast as answered, Retry-After ignored, so all
  but its first few requests are 429s refused before the body is read (with the read hold off, which
  would otherwise stop reading such a key's connections).

It prints the gateway process's CPU per answered request (user + system, the benchmark's own
:class:`loadtest.isolation_stack.CpuMeter`), the load generator's own CPU per answered request over
the same window (:attr:`loadtest.loadgen.runner.LoadRun.cpu_s`: what a client pays for the answers)
and, from a second gateway started under cProfile, the
functions that cost the most per request (exclusive and inclusive microseconds; the profiler's own
overhead inflates them, so compare them with each other, and the CPU figure across commits).

``--floors`` measures, on the admitted path's load and model, the servers of
:mod:`loadtest.proxy_floor` instead of the profile: uvicorn alone, and Python proxies to Triton
with nothing of the gateway's work (aiohttp, FastAPI + aiohttp, grpc.aio). The gateway's figure
less theirs is what its own work costs; theirs is what no Python gateway on these libraries can go
below on this machine. Measured, never asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import pstats
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from gateway.observe.gc_pauses import OBSERVE_INTERVAL_S
from loadtest.bench.gateway_split import gateway_counters
from loadtest.bench.settings import point_spec
from loadtest.isolation_stack import (
    DEFAULT_SETTINGS,
    CpuMeter,
    IsolationSettings,
    Stack,
    infer_body,
    infer_url,
    json_target,
    platform,
)
from loadtest.loadgen import HttpTarget, LoadSpec
from loadtest.loadgen import run as run_specs
from loadtest.options import run_time_values
from loadtest.qos import QosSettings, prepare_repository
from serving.console import Table, print_table
from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.launcher import TritonPorts, TritonServer
from serving.ports import reserve_port

__all__ = [
    "FLOOR_LABELS",
    "PATHS",
    "build_parser",
    "floors_table",
    "measure_floors",
    "measure_path",
    "run",
    "save_floors_plot",
]

#: path name -> the tier of the key that drives it
PATHS = {"admitted": "enterprise", "refused": "free"}


def _target(stack: Stack, path: str) -> HttpTarget:
    return json_target(stack.url, stack.new_key(f"profile-{path}", PATHS[path]), infer_body(), path)


class PathCpu(NamedTuple):
    """The gateway's CPU on one path: milliseconds per answered request (user and system apart)."""

    user_ms: float
    system_ms: float
    answered: int
    statuses: dict[int, int]
    #: the gateway's collector pauses over the load, warm-up included: per generation, how many and
    #: their milliseconds in all (``gateway_gc_pause_seconds``; empty for the floor servers)
    gc_pauses: tuple[tuple[int, float], ...] = ()
    #: the load generator's own CPU per answered request, same window: what a client pays for the
    #: server's answers (how many writes they come in, their headers)
    client_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.user_ms + self.system_ms

    def describe(self, path: str, duration_s: float, server: str = "gateway") -> str:
        pauses = ", ".join(
            f"generation {g}: {n} ({ms:.1f} ms in all)" for g, (n, ms) in enumerate(self.gc_pauses)
        )
        return (
            f"{path}: {server} CPU {self.total_ms:.3f} ms per request (user {self.user_ms:.3f}, "
            f"system {self.system_ms:.3f}; {self.answered} answered in {duration_s:g} s, "
            f"statuses {self.statuses}; the load generator {self.client_ms:.3f} ms)"
            + (f"\n  collector pauses over the load and its warm-up: {pauses}" if pauses else "")
        )


def _cpu_per_request(pid: int, spec: LoadSpec) -> PathCpu:
    with CpuMeter(pid) as meter:
        (load,) = run_specs([spec], apart=True)
    result = load.result()
    answered = max(1, result.requests + result.errors)
    user, system = meter.split(*load.window)
    return PathCpu(
        1000.0 * user / answered,
        1000.0 * system / answered,
        answered,
        dict(result.statuses),
        client_ms=1000.0 * load.cpu_s / answered,
    )


def measure_path(
    path: str,
    settings: IsolationSettings,
    profile_to: Path | None = None,
    gateway_env: dict[str, str] | None = None,
) -> PathCpu:
    """Drive ``path`` against a fresh platform.

    Args:
        path: a key of :data:`PATHS`.
        settings: the benchmark's settings (model, concurrency, warm-up, duration).
        profile_to: run the gateway under cProfile, its statistics written here.
        gateway_env: ``GATEWAY_*`` settings added to the gateway's environment.

    Returns:
        The gateway's CPU per request answered in the measured window.
    """
    with tempfile.TemporaryDirectory(prefix="gateway-profile-") as tmp:
        # The refused path is a closed loop that ignores Retry-After: with the read hold on (the
        # default), its connections would be held and nothing measured. This measures what each
        # refusal costs, so the hold is off here.
        env = dict(gateway_env or {})
        if path == "refused":
            env["GATEWAY_HOLD_IGNORED_RETRY_AFTER_S"] = "0"
        with platform(Path(tmp), settings, profile_to=profile_to, gateway_env=env) as stack:
            spec = point_spec(_target(stack, path), settings.protected_concurrency, settings, path)
            before = gateway_counters(stack.url, stack.metrics_token)
            cpu = _cpu_per_request(stack.pid, spec)
            time.sleep(OBSERVE_INTERVAL_S + 0.2)  # the last pauses reach the histogram
            after = gateway_counters(stack.url, stack.metrics_token)
            return cpu._replace(
                gc_pauses=tuple(
                    (
                        int(after[f"gc{g}_n"] - before[f"gc{g}_n"]),
                        1000.0 * (after[f"gc{g}_s"] - before[f"gc{g}_s"]),
                    )
                    for g in range(3)
                )
            )


def measure_floors(settings: IsolationSettings, modes: tuple[str, ...]) -> dict[str, PathCpu]:
    """Each :mod:`loadtest.proxy_floor` server's CPU per request on the admitted path's load.

    Args:
        settings: the benchmark's settings (model, concurrency, warm-up, duration).
        modes: the servers, :data:`loadtest.proxy_floor.MODES` or some of them, measured in turn
            against one Triton.

    Returns:
        Mode -> its CPU per request answered in the measured window.
    """
    floors = {}
    with tempfile.TemporaryDirectory(prefix="gateway-floor-") as tmp:
        repository = prepare_repository(
            Path(tmp) / "repository",
            QosSettings(service_ms=settings.service_ms, instances=settings.instances),
        )
        with TritonServer(repository, ports=TritonPorts.free()) as triton:
            for mode in modes:
                port = reserve_port()
                args = ("--port", str(port), "--triton-http", triton.http_url)
                launch = GatewayLaunch(
                    port,
                    args=(*args, "--triton-grpc", triton.grpc_url),
                    entry=("loadtest.proxy_floor", mode),
                    name=f"proxy floor {mode}",
                    log_path=Path(tmp) / f"{mode}.log",
                )
                with start_gateway_process(launch) as server:
                    assert server.pid is not None
                    target = HttpTarget(
                        url=infer_url(launch.url),
                        requests=((infer_body(), {"Content-Type": "application/json"}),),
                        name=mode,
                        timeout_s=120.0,
                    )
                    spec = point_spec(target, settings.protected_concurrency, settings, mode)
                    floors[mode] = _cpu_per_request(server.pid, spec)
                print(floors[mode].describe(mode, settings.duration_s, "floor"), flush=True)
    return floors


#: what each floor server is, for the table
FLOOR_LABELS = {
    "server": "uvicorn alone (fixed answer, no upstream)",
    "aiohttp": "raw ASGI proxy, aiohttp to Triton",
    "pool": "raw ASGI proxy, the gateway's pool to Triton",
    "fastapi": "FastAPI route + JSON parse, aiohttp to Triton",
    "grpc": "raw ASGI + JSON parse, grpc.aio to Triton",
}


def floors_table(
    gateway: PathCpu, floors: dict[str, PathCpu], settings: IsolationSettings
) -> Table:
    """The gateway's CPU per request beside each floor's."""
    table = Table(
        title="CPU per request: the gateway and servers with none of its work",
        columns=["server", "CPU ms / request", "the gateway's extra ms"],
        caption=f"each server alone on one Triton (fixed {settings.service_ms:g} ms model), closed "
        f"loop at concurrency {settings.protected_concurrency}, {settings.warmup_s:g} s warm-up + "
        f"{settings.duration_s:g} s measured; user + system CPU of the server process",
    )
    for mode, cpu in floors.items():
        table.add_row(
            FLOOR_LABELS[mode], f"{cpu.total_ms:.3f}", f"{gateway.total_ms - cpu.total_ms:+.3f}"
        )
    table.add_row("the gateway (admitted path)", f"{gateway.total_ms:.3f}", "")
    return table


def save_floors_plot(record: dict[str, Any], path: Path) -> None:
    """``floors.json``'s figures as bars (user and system CPU stacked), the gateway's last."""
    from loadtest.plotting import saved_figure

    rows = [(FLOOR_LABELS[mode], cpu) for mode, cpu in record["floors_ms_per_request"].items()] + [
        ("the gateway", record["gateway_ms_per_request"])
    ]
    with saved_figure(path, figsize=(9, 3.6), dpi=110) as (_, ax):
        ys = range(len(rows))
        users = [cpu["user_ms"] for _, cpu in rows]
        ax.barh(ys, users, color="tab:blue", label="user")
        ax.barh(
            ys,
            [cpu["system_ms"] for _, cpu in rows],
            left=users,
            color="tab:orange",
            label="system",
        )
        ax.set_yticks(list(ys), [label for label, _ in rows])
        ax.invert_yaxis()
        ax.set_xlabel("server process CPU, ms per request")
        ax.set_title("The gateway's CPU per request beside servers with none of its work")
        ax.legend(loc="upper right")  # the short bars are at the top


def top_functions(profile: Path, limit: int) -> str:
    """The ``limit`` costliest functions of ``profile`` by exclusive time, in microseconds per
    request, beside their inclusive time. Every HTTP request the gateway served counts (warm-up
    included); start-up is in the profile too, so functions only start-up runs show up with a few
    calls per thousand requests. A function that writes to a socket carries the system call's
    time (uvloop's transports are not profiled apart)."""
    stats = pstats.Stats(str(profile), stream=io.StringIO())
    table = stats.stats  # type: ignore[attr-defined]
    # Coroutines count a call per resumption, so requests are counted by a plain function uvicorn
    # calls once per request (its parser's end-of-headers callback).
    requests = max(
        (v[1] for (f, _, name), v in table.items() if name == "on_headers_complete"), default=1
    )
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in table.items():
        rows.append((tottime, cumtime, calls, f"{Path(filename).name}:{line}({name})"))
    rows.sort(reverse=True)
    per = 1e6 / max(1, requests)
    lines = [
        f"{requests} requests served (warm-up included)",
        f"{'excl us/req':>11} {'incl us/req':>11} {'calls/req':>9}  function",
    ]
    lines += [
        f"{t * per:11.1f} {c * per:11.1f} {n / max(1, requests):9.2f}  {where}"
        for t, c, n, where in rows[:limit]
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="The gateway's CPU per request on the isolation benchmark's admitted or "
        "refused path, and a cProfile of the same path (the costliest functions, microseconds per "
        "request).",
    )
    parser.add_argument("--path", choices=sorted(PATHS), default="admitted")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_SETTINGS.protected_concurrency)
    parser.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="GATEWAY_NAME=VALUE",
        help="a setting added to the gateway's environment (repeatable); e.g. "
        "GATEWAY_GC_FREEZE=false measures the gateway without its collector freeze",
    )
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument(
        "--profile", type=Path, help="keep the cProfile statistics here (default: a temporary file)"
    )
    parser.add_argument("--no-profile", action="store_true", help="only the CPU figure")
    parser.add_argument(
        "--floors",
        action="store_true",
        help="instead of the profile, the CPU per request of Python servers and proxies with none "
        "of the gateway's work (loadtest.proxy_floor), on the admitted path's load",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="with --floors: write floors.json, floors.txt and floors.png into this folder",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench gateway-profile``: the parsed options in, the exit status out."""
    settings = replace(
        DEFAULT_SETTINGS,
        **run_time_values(args),
        protected_concurrency=args.concurrency,
    )
    if any("=" not in item or not item.startswith("GATEWAY_") for item in args.gateway_env):
        raise SystemExit("--gateway-env takes GATEWAY_NAME=VALUE")
    gateway_env = dict(item.split("=", 1) for item in args.gateway_env)
    gateway = measure_path(args.path, settings, gateway_env=gateway_env)
    print(gateway.describe(args.path, settings.duration_s), flush=True)
    if args.floors:
        from loadtest.proxy_floor import MODES

        floors = measure_floors(settings, MODES)
        table = floors_table(gateway, floors, settings)
        print_table(table)
        failed = [m for m, c in {"gateway": gateway, **floors}.items() if set(c.statuses) != {200}]
        if failed:  # a figure over refused requests is no floor
            print(f"not every request was answered 200 by: {', '.join(failed)}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            record = {
                "settings": {
                    "concurrency": settings.protected_concurrency,
                    "duration_s": settings.duration_s,
                    "warmup_s": settings.warmup_s,
                    "service_ms": settings.service_ms,
                    "path": args.path,
                },
                "gateway_ms_per_request": gateway._asdict(),
                "floors_ms_per_request": {m: c._asdict() for m, c in floors.items()},
            }
            (args.out / "floors.json").write_text(json.dumps(record, indent=2) + "\n")
            (args.out / "floors.txt").write_text(table.plain() + "\n")
            save_floors_plot(record, args.out / "floors.png")
        return 1 if failed else 0
    if args.no_profile:
        from loadtest.collector_cost import full_collection_ms

        full = full_collection_ms()
        print(
            "one full collection in a process holding the gateway's app: "
            f"{full['full_ms']:.1f} ms; "
            f"{full['frozen_full_ms']:.1f} ms once its {full['frozen_objects']:,.0f} start-up "
            "objects are frozen (GATEWAY_GC_FREEZE)",
            flush=True,
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="gateway-profile-") as tmp:
        profile = args.profile or Path(tmp) / "gateway.prof"
        profiled = measure_path(args.path, settings, profile_to=profile, gateway_env=gateway_env)
        print("under cProfile: " + profiled.describe(args.path, settings.duration_s))
        print(top_functions(profile, args.top))
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("gateway-profile"))
