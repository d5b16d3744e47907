"""How long a change made through one gateway replica takes to apply on another (shared Redis state).

    python -m loadtest.propagation --trials 30

Starts a redis-server, the embedded Triton serving versions 1 and 2 of a model that answers at once
(the gateway checks the versions a weight names against Triton), and two gateway processes (one
worker each) that share Redis, then repeats:

- **revocation**: a key is created through replica A and used on replica B (B now has it cached);
  the key is revoked through A; B is asked again and again (``GET /v1/stats`` with the key) until it
  answers 401;
- **canary weights**: new weights are set through A; B's ``GET /admin/traffic`` is read until it
  shows them (B's table is what its requests draw versions from).

Each change is made at a random moment of B's sync interval. Each delay runs from the moment A
answered the change (it is committed in Redis then) to B's first
answer showing it; B is polled back to back, so the figure includes one poll's time. The mechanism
(:mod:`gateway.tenancy.state_sync`) checks Redis every ``--sync-interval-s`` seconds, so delays should
spread over that interval; percentiles from :mod:`serving.quantiles`.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from gateway.tenancy.secret_policy import generate_secret
from loadtest.scaling_stack import BENCH_TIER, gateway_process, machine_load, write_tiny_model
from serving.console import Table, make_console, print_table
from serving.quantiles import summarize
from serving.redis_process import redis_server

__all__ = ["build_parser", "measure", "run"]

_POLL_LIMIT_S = 10.0
_MODEL = "bench_model"


def _until(check: Callable[[], bool]) -> float:
    """Seconds until ``check()`` first holds (polled back to back).

    Raises:
        RuntimeError: not within 10 s (the mechanism is broken, not slow).
    """
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > _POLL_LIMIT_S:
            raise RuntimeError(
                f"the change did not apply on the other replica within {_POLL_LIMIT_S:.0f} s"
            )
    return time.perf_counter() - start


def _refuses(client: httpx.Client, auth: dict[str, str]) -> bool:
    return client.get("/v1/stats", headers=auth).status_code == 401


def _shows(client: httpx.Client, admin: dict[str, str], share: float) -> bool:
    table = client.get("/admin/traffic", headers=admin).json()["models"]
    return abs(float(table.get(_MODEL, {}).get("1", -1.0)) - share) < 1e-9


def measure(trials: int, sync_interval_s: float, seed: int = 0) -> dict[str, list[float]]:
    """Start Redis and two gateways; return the measured delays (seconds) per kind of change."""
    rng = random.Random(seed)
    admin_token = generate_secret()  # the gateway refuses a placeholder; each run makes its own
    admin = {"X-Admin-Token": admin_token}
    delays: dict[str, list[float]] = {"revocation": [], "canary weights": []}
    from serving.launcher import TritonPorts, TritonServer

    with (
        tempfile.TemporaryDirectory(prefix="propagation-") as tmp,
        redis_server(Path(tmp)) as redis_url,
    ):
        write_tiny_model(Path(tmp) / "repository", _MODEL, versions=(1, 2))
        triton = TritonServer(Path(tmp) / "repository", models=[_MODEL], ports=TritonPorts.free())
        settings = {
            "GATEWAY_REDIS_URL": redis_url,
            "GATEWAY_WORKERS": "1",
            "GATEWAY_ADMIN_TOKEN": admin_token,
            "GATEWAY_TIER_LIMITS": json.dumps(BENCH_TIER),
            "GATEWAY_STATE_SYNC_INTERVAL_S": str(sync_interval_s),
            "GATEWAY_TRITON_STATS_INTERVAL_S": "0",  # statistics are not what is measured
            "GATEWAY_TRITON_HTTP_URL": triton.http_url,
        }
        with (
            triton,
            gateway_process("replica A", settings, Path(tmp)) as a,
            gateway_process("replica B", settings, Path(tmp)) as b,
            httpx.Client(base_url=f"http://{a}", headers=admin, timeout=10) as on_a,
            httpx.Client(base_url=f"http://{b}", timeout=10) as on_b,
        ):
            for trial in range(trials):
                created = (
                    on_a.post("/admin/keys", json={"name": f"t{trial}", "tier": "bench"})
                    .raise_for_status()
                    .json()
                )
                auth = {"Authorization": f"Bearer {created['api_key']}"}
                on_b.get("/v1/stats", headers=auth).raise_for_status()  # B has it cached now
                # A change lands at a random moment of B's sync interval, as a real one would (right
                # after the previous measurement it would always land just after B's check).
                time.sleep(rng.uniform(0, sync_interval_s))
                on_a.delete(f"/admin/keys/{created['key_id']}").raise_for_status()
                delays["revocation"].append(_until(partial(_refuses, on_b, auth)))

                time.sleep(rng.uniform(0, sync_interval_s))
                on_a.put(
                    f"/admin/traffic/{_MODEL}", json={"versions": {"1": trial + 1.0, "2": 1.0}}
                ).raise_for_status()
                share = (trial + 1) / (trial + 2)
                delays["canary weights"].append(_until(partial(_shows, on_b, admin, share)))
    return delays


def report(
    delays: dict[str, list[float]], sync_interval_s: float, machine: dict[str, object]
) -> Table:
    table = Table(
        "Propagation of a change between two gateway replicas sharing Redis",
        ("change", "trials", "P50 ms", "P95 ms", "P99 ms", "max ms", "mean ms"),
        caption=f"state sync interval {sync_interval_s:g} s; from A's answer to B's first answer showing it; "
        f"machine: {machine}",
    )
    for kind, values in delays.items():
        summary = summarize([v * 1000 for v in values])
        assert summary is not None
        table.add_row(
            kind,
            len(values),
            f"{summary.p50:.1f}",
            f"{summary.p95:.1f}",
            f"{summary.p99:.1f}",
            f"{summary.max:.1f}",
            f"{summary.mean:.1f}",
        )
    return table


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench propagation``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trials", type=int, default=30, help="changes of each kind (default: %(default)s)"
    )
    parser.add_argument(
        "--sync-interval-s",
        type=float,
        default=0.2,
        help="GATEWAY_STATE_SYNC_INTERVAL_S of both replicas (default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the delays (ms) as JSON instead of a table"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench propagation``: the parsed options in, the exit status out."""
    before = machine_load()
    delays = measure(args.trials, args.sync_interval_s)
    if args.json:
        print(json.dumps({k: [round(v * 1000, 3) for v in vs] for k, vs in delays.items()}))
    else:
        print_table(report(delays, args.sync_interval_s, before), make_console())
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("propagation"))
