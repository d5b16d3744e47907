"""Headless locust runs with a bounded duration, writing CSV and HTML reports.

    python -m loadtest.run --host http://127.0.0.1:8080 --scenarios classify,embeddings,v2 \\
        --users 16 --spawn-rate 4 --run-time 60s --out reports/loadtest
    LOADTEST_TARGET=triton python -m loadtest.run --host http://127.0.0.1:8000 --scenarios v2 --run-time 20s

Locust runs in its own process (it monkey-patches the standard library with gevent), under a
wall-clock limit of ``--run-time`` plus a grace period, so a run can never outlive its budget. The
reports are ``<out>/<prefix>_stats.csv``, ``_stats_history.csv``, ``_failures.csv``,
``_exceptions.csv`` and ``<out>/<prefix>.html``; :func:`run_locust` returns the parsed stats rows and
the final counts (``<out>/<prefix>_summary.json``, written when locust quits).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.scenarios import SCENARIOS
from serving.processes import child_env

__all__ = [
    "LOCUSTFILE",
    "LocustRun",
    "LocustSettings",
    "build_parser",
    "parse_duration",
    "run",
    "run_locust",
]

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
DEFAULT_OUT = Path("reports/loadtest")
GRACE_S = 60.0


def parse_duration(text: str) -> float:
    """Seconds in locust's ``--run-time`` notation (``90``, ``30s``, ``2m``, ``1h30m``)."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 2m, 1h30m)")
    return float(sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts))


@dataclass
class LocustRun:
    """What a headless run left behind."""

    returncode: int
    csv_prefix: Path
    html: Path
    stats: list[dict[str, str]] = field(default_factory=list)
    output: str = ""
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        return int(self.summary.get("failures", 0))

    @property
    def requests(self) -> int:
        return int(self.summary.get("requests", 0))

    def count(self, name: str) -> int:
        """Requests answered under ``name`` (a route, or a name the locustfile gave)."""
        return int(self.summary.get("entries", {}).get(name, {}).get("requests", 0))


def _classes(scenarios: Sequence[str]) -> list[str]:
    names = []
    for scenario in scenarios:
        if scenario == "all":
            return []
        if scenario in SCENARIOS:
            names.append(SCENARIOS[scenario])
        elif scenario in SCENARIOS.values():
            names.append(scenario)
        else:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}, all")
    return names


@dataclass(frozen=True)
class LocustSettings:
    """How one locust run is shaped, and where its reports go.

    Attributes:
        max_requests: end the run as soon as this many requests were answered (``run_time`` stays
            the upper bound); 0 runs for ``run_time``.
    """

    users: int = 4
    spawn_rate: float = 4
    run_time: str = "30s"
    out_dir: Path = DEFAULT_OUT
    prefix: str = "loadtest"
    max_requests: int = 0


def run_locust(
    host: str,
    scenarios: Sequence[str] = ("all",),
    settings: LocustSettings = LocustSettings(),
    *,
    env: Mapping[str, str] | None = None,
) -> LocustRun:
    """Run locust headless against ``host`` for ``settings.run_time`` and read back its CSV stats.

    Args:
        host: base URL of the gateway (or of Triton with ``LOADTEST_TARGET=triton``).
        scenarios: names from :data:`loadtest.scenarios.SCENARIOS` (or User class names); ``all``
            runs every class in the locustfile.
        env: extra environment for the locust process (keys, ``LOADTEST_*`` settings).

    Raises:
        subprocess.TimeoutExpired: locust outlived ``run_time`` plus the grace period (it is killed).
    """
    out_dir, prefix, run_time = settings.out_dir, settings.prefix, settings.run_time
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_prefix, html = out_dir / prefix, out_dir / f"{prefix}.html"
    summary_file = out_dir / f"{prefix}_summary.json"
    summary_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        host,
        "-u",
        str(settings.users),
        "-r",
        str(settings.spawn_rate),
        "--run-time",
        run_time,
        "--stop-timeout",
        "10",
        "--csv",
        str(csv_prefix),
        "--csv-full-history",
        "--html",
        str(html),
        "--only-summary",
        "--loglevel",
        "WARNING",
        *_classes(scenarios),
    ]
    completed = subprocess.run(
        cmd,
        env=child_env(
            {
                **(env or {}),
                "LOADTEST_MAX_REQUESTS": str(settings.max_requests),
                "LOADTEST_SUMMARY": str(summary_file),
            }
        ),
        capture_output=True,
        text=True,
        timeout=parse_duration(run_time) + GRACE_S,
        check=False,
    )
    stats_file = Path(f"{csv_prefix}_stats.csv")
    stats: list[dict[str, str]] = []
    if stats_file.exists():
        with stats_file.open(encoding="utf-8") as handle:
            stats = list(csv.DictReader(handle))
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.exists() else {}
    return LocustRun(
        completed.returncode, csv_prefix, html, stats, completed.stdout + completed.stderr, summary
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--host", required=True, help="gateway base URL, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument(
        "--scenarios",
        default="all",
        help="comma separated: classify,embeddings,generation,v2,free,standard,premium or all",
    )
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--spawn-rate", type=float, default=4)
    parser.add_argument("--run-time", default="30s", help="bounded duration, e.g. 30s, 5m")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prefix", default="loadtest")
    parser.add_argument("--target", choices=["gateway", "triton"], help="sets LOADTEST_TARGET")
    parser.add_argument(
        "--api-key", help="sets LOADTEST_API_KEY (prefer the environment: argv is visible to ps)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench locust``: the parsed options in, the exit status out."""
    env = {}
    if args.target:
        env["LOADTEST_TARGET"] = args.target
    if args.api_key:
        env["LOADTEST_API_KEY"] = args.api_key
    locust = run_locust(
        args.host,
        [s.strip() for s in args.scenarios.split(",") if s.strip()],
        LocustSettings(args.users, args.spawn_rate, args.run_time, args.out, args.prefix),
        env=env,
    )
    print(locust.output[-4000:])
    print(
        f"requests {locust.requests}, failures {locust.failures}; reports: "
        f"{locust.csv_prefix}_stats.csv, {locust.html}"
    )
    return 0 if locust.returncode == 0 and locust.requests > 0 else 1


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("locust"))
