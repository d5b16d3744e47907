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
:class:`loadtest.isolation_stack.CpuMeter`) and, from a second gateway started under cProfile, the
functions that cost the most per request (exclusive and inclusive microseconds; the profiler's own
overhead inflates them, so compare them with each other, and the CPU figure across commits).
Measured, never asserted.
"""

from __future__ import annotations

import argparse
import io
import pstats
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from loadtest.isolation_stack import (
    DEFAULT_SETTINGS,
    CpuMeter,
    IsolationSettings,
    Stack,
    infer_body,
    json_target,
    platform,
)
from loadtest.loadgen import HttpTarget, LoadSpec
from loadtest.loadgen import run as run_specs
from loadtest.options import run_time_values

__all__ = ["PATHS", "build_parser", "measure_path", "run"]

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

    @property
    def total_ms(self) -> float:
        return self.user_ms + self.system_ms

    def describe(self, path: str, duration_s: float) -> str:
        return (
            f"{path}: gateway CPU {self.total_ms:.3f} ms per request (user {self.user_ms:.3f}, "
            f"system {self.system_ms:.3f}; {self.answered} answered in {duration_s:g} s, "
            f"statuses {self.statuses})"
        )


def _cpu_per_request(stack: Stack, spec: LoadSpec) -> PathCpu:
    with CpuMeter(stack.pid) as meter:
        (load,) = run_specs([spec], apart=True)
    result = load.result()
    answered = max(1, result.requests + result.errors)
    user, system = meter.split(*load.window)
    return PathCpu(
        1000.0 * user / answered, 1000.0 * system / answered, answered, dict(result.statuses)
    )


def measure_path(path: str, settings: IsolationSettings, profile_to: Path | None = None) -> PathCpu:
    """Drive ``path`` against a fresh platform.

    Args:
        path: a key of :data:`PATHS`.
        settings: the benchmark's settings (model, concurrency, warm-up, duration).
        profile_to: run the gateway under cProfile, its statistics written here.

    Returns:
        The gateway's CPU per request answered in the measured window.
    """
    with tempfile.TemporaryDirectory(prefix="gateway-profile-") as tmp:
        # The refused path is a closed loop that ignores Retry-After: with the read hold on (the
        # default), its connections would be held and nothing measured. This measures what each
        # refusal costs, so the hold is off here.
        hold = {"GATEWAY_HOLD_IGNORED_RETRY_AFTER_S": "0"} if path == "refused" else None
        with platform(Path(tmp), settings, profile_to=profile_to, gateway_env=hold) as stack:
            spec = LoadSpec(
                target=_target(stack, path),
                concurrency=settings.protected_concurrency,
                duration_s=settings.duration_s,
                warmup_s=settings.warmup_s,
                name=path,
            )
            return _cpu_per_request(stack, spec)


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
        description="The gateway's CPU per request on the isolation benchmark's admitted or refused path, and a "
        "cProfile of the same path (the costliest functions, microseconds per request).",
    )
    parser.add_argument("--path", choices=sorted(PATHS), default="admitted")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_SETTINGS.protected_concurrency)
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument(
        "--profile", type=Path, help="keep the cProfile statistics here (default: a temporary file)"
    )
    parser.add_argument("--no-profile", action="store_true", help="only the CPU figure")
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench gateway-profile``: the parsed options in, the exit status out."""
    settings = replace(
        DEFAULT_SETTINGS,
        **run_time_values(args),
        protected_concurrency=args.concurrency,
    )
    print(measure_path(args.path, settings).describe(args.path, settings.duration_s), flush=True)
    if args.no_profile:
        return 0
    with tempfile.TemporaryDirectory(prefix="gateway-profile-") as tmp:
        profile = args.profile or Path(tmp) / "gateway.prof"
        profiled = measure_path(args.path, settings, profile_to=profile)
        print("under cProfile: " + profiled.describe(args.path, settings.duration_s))
        print(top_functions(profile, args.top))
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("gateway-profile"))
