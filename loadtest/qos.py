"""Quality of service by tier, measured: premium latency and free-tier shedding under overload.

``python -m loadtest.qos`` (or ``inferctl bench qos``) serves a model with a fixed service time from
the real Triton binary, puts two real gateways in front of it, and drives both tiers at once with
the platform's load generator (:mod:`loadtest.loadgen`):

1. saturation: premium-only closed loops at growing concurrency find where throughput stops
   growing (the saturating concurrency ``C``);
2. ``premium alone``: the premium share of the overload, with nothing else running (its latency
   when the model is not overloaded);
3. ``priorities off`` and ``priorities on``: ``load x C`` requests in flight (default 2x), a
   ``premium_fraction`` of them premium, the rest free tier, through a gateway whose tiers all
   share one priority and the whole in-flight bound (off), and through one with the default tier
   policy (on: premium at Triton priority 1 with the whole bound, free at priority 3 with half of it).

Both gateways bound in-flight requests per model at ``load x C`` (``--max-in-flight``), the model's
configs carry the builders' queue policies and priority levels, and clients honour Retry-After
(as the OpenAI SDKs do) unless ``--impolite``. The table gives premium P50/P99 and throughput, the
free tier's throughput and the share of its requests shed with 429 (and timed out with 504); a
plot and a JSON document go to ``--out`` (the figures, table and plot: :mod:`loadtest.qos_report`).
Figures are measured, never asserted: compare the rows of one run, the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from builders.spec import BatchingPolicy, TensorSpec
from builders.triton_config import ConfigOptions, model_config, write_config
from loadtest.loadgen import HttpTarget, LoadResult, LoadSpec, run_load
from loadtest.loadgen import run as run_specs
from loadtest.local_gateway import local_gateway
from loadtest.options import (
    FieldOption,
    add_field_options,
    add_run_time_arguments,
    settings_from_options,
    settings_record,
)
from loadtest.qos_report import TierFigures, report_table, save_plot, tier_figures
from serving.console import make_console, print_table
from serving.launcher import TritonPorts, TritonServer

__all__ = [
    "DEFAULT_SETTINGS",
    "QosSettings",
    "MODEL_OPTIONS",
    "build_parser",
    "run",
    "run_qos",
]

MODEL = "qos_work"
_MODEL_FILE = Path(__file__).with_name("qos_model.py")
_REQUEST = json.dumps(
    {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]}
).encode()
_UNLIMITED = {"per_minute": 1e9, "burst": 1_000_000}


@dataclass(frozen=True, kw_only=True)
class QosSettings:
    """What the QoS benchmark runs.

    Args:
        service_ms: how long the model holds an instance per request.
        instances: model instances (requests served at once).
        load: offered concurrency as a multiple of the saturating concurrency.
        premium_fraction: share of the offered concurrency that is premium.
        max_in_flight: the gateways' bound per model (0: ``load x C``).
        warmup_s, duration_s: per measured run.
        sweep_s: per step of the saturation sweep.
        polite: clients wait Retry-After after a 429/503.
        processes: load-generator processes.
        out_dir: where qos.json and qos.png go.
    """

    service_ms: float = 40.0
    instances: int = 4
    load: float = 2.0
    premium_fraction: float = 0.25
    max_in_flight: int = 0
    warmup_s: float = 3.0
    duration_s: float = 20.0
    sweep_s: float = 4.0
    polite: bool = True
    processes: int = 1
    out_dir: Path = Path("qos-results")


DEFAULT_SETTINGS = QosSettings()


def prepare_repository(root: Path, settings: QosSettings) -> Path:
    """The benchmark's model, configured as the builders configure every model (queue policies,
    priorities)."""
    entry = root / MODEL
    (entry / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy2(_MODEL_FILE, entry / "1" / "model.py")
    config = model_config(
        MODEL,
        inputs=[TensorSpec("X", "int32", (1,))],
        outputs=[TensorSpec("Y", "int32", (1,))],
        batching=BatchingPolicy(max_batch_size=0, instance_count=settings.instances),
        options=ConfigOptions(
            backend="python", parameters={"service_ms": f"{settings.service_ms:g}"}, warmup=False
        ),
    )
    write_config(config, entry / "config.pbtxt")
    return root


def tier_policies(priorities: bool) -> dict[str, dict[str, Any]]:
    """The two tiers, as the default tier policy has them (on) or with one priority and share (off)."""
    if priorities:
        return {
            "premium": {**_UNLIMITED, "priority": 1, "in_flight_share": 1.0},
            "free": {**_UNLIMITED, "priority": 3, "in_flight_share": 0.5},
        }
    return {
        tier: {**_UNLIMITED, "priority": 3, "in_flight_share": 1.0} for tier in ("premium", "free")
    }


@contextlib.contextmanager
def gateway(
    triton_http_url: str, workdir: Path, *, priorities: bool, max_in_flight: int
) -> Iterator[tuple[str, dict[str, str]]]:
    """A real gateway with a premium and a free key; yields ``(base URL, {tier: api key})``."""
    with local_gateway(
        triton_http_url,
        workdir,
        tiers=tier_policies(priorities),
        key_names={tier: f"qos-{tier}" for tier in ("premium", "free")},
        env={"GATEWAY_MAX_IN_FLIGHT_PER_MODEL": str(max_in_flight)},
    ) as started:
        yield started.url, started.keys


def _target(base_url: str, key: str, name: str) -> HttpTarget:
    return HttpTarget(
        url=f"{base_url}/v2/models/{MODEL}/infer",
        requests=((_REQUEST, {"Content-Type": "application/json"}),),
        headers={"Authorization": f"Bearer {key}"},
        name=name,
        timeout_s=120.0,
    )


def find_saturation(base_url: str, key: str, settings: QosSettings) -> tuple[int, list[LoadResult]]:
    """The smallest concurrency whose throughput is within 10% of the best seen, and the sweep."""
    sweep: list[LoadResult] = []
    concurrency = 1
    while True:
        spec = LoadSpec(
            target=_target(base_url, key, "premium"),
            concurrency=concurrency,
            duration_s=settings.sweep_s,
            warmup_s=1.0,
            name=f"sweep c={concurrency}",
        )
        sweep.append(run_load(spec, settings.processes))
        best = max(r.throughput for r in sweep)
        # Stop once doubling the concurrency bought less than 10% (and we are past the instance count).
        if (
            len(sweep) > 1
            and concurrency > settings.instances
            and sweep[-1].throughput < 1.1 * sweep[-2].throughput
        ):
            break
        if concurrency >= 64 * settings.instances:
            break
        concurrency *= 2
    saturating = min(r.concurrency for r in sweep if r.throughput >= 0.9 * best)
    return saturating, sweep


def _mixed(
    base_url: str, keys: dict[str, str], premium: int, free: int, settings: QosSettings
) -> list[TierFigures]:
    specs = [
        LoadSpec(
            target=_target(base_url, keys[tier], tier),
            concurrency=n,
            duration_s=settings.duration_s,
            warmup_s=settings.warmup_s,
            honour_retry_after=settings.polite,
            name=tier,
        )
        for tier, n in (("premium", premium), ("free", free))
        if n > 0
    ]
    return [tier_figures(r.spec.label, r.result()) for r in run_specs(specs, settings.processes)]


def run_qos(settings: QosSettings) -> dict[str, Any]:
    """Run the benchmark; returns the JSON document it also writes (with the table and plot paths)."""
    console = make_console(stderr=True)
    out = settings.out_dir
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qos-") as tmp:
        work = Path(tmp)
        repository = prepare_repository(work / "repository", settings)
        console.print(
            f"starting Triton ({MODEL}: {settings.instances} instances x {settings.service_ms:g} ms)"
        )
        with TritonServer(repository, ports=TritonPorts.free()) as triton:
            with gateway(triton.http_url, work / "off", priorities=False, max_in_flight=4096) as (
                url,
                keys,
            ):
                console.print("finding the saturating concurrency (premium only, priorities off)")
                saturating, sweep = find_saturation(url, keys["premium"], settings)
            offered = max(2, round(settings.load * saturating))
            premium = max(1, round(settings.premium_fraction * offered))
            free = max(1, offered - premium)
            bound = settings.max_in_flight or offered
            runs: dict[str, list[TierFigures]] = {}
            for label, priorities, tiers in (
                ("premium alone", True, (premium, 0)),
                ("priorities off", False, (premium, free)),
                ("priorities on", True, (premium, free)),
            ):
                console.print(
                    f"{label}: premium x{tiers[0]}, free x{tiers[1]}, in-flight bound {bound}"
                )
                with gateway(
                    triton.http_url,
                    work / label.replace(" ", "-"),
                    priorities=priorities,
                    max_in_flight=bound,
                ) as (url, keys):
                    runs[label] = _mixed(url, keys, *tiers, settings)
    document = {
        "settings": settings_record(asdict(settings)),
        "capacity_rps": settings.instances * 1000.0 / settings.service_ms,
        "saturating_concurrency": saturating,
        "offered": {"premium": premium, "free": free, "in_flight_bound": bound},
        "sweep": [
            {"concurrency": r.concurrency, "throughput": r.throughput, "p99_ms": r.p99_ms}
            for r in sweep
        ],
        "runs": {
            label: [
                asdict(f) | {"shed_rate": f.shed_rate, "timeout_rate": f.timeout_rate}
                for f in figures
            ]
            for label, figures in runs.items()
        },
    }
    table = report_table(runs, document, model=MODEL)
    print_table(table)
    document["table"] = table.as_records()
    json_path = out / "qos.json"
    json_path.write_text(json.dumps(document, indent=2))
    document["files"] = {
        "json": str(json_path),
        "png": str(save_plot(runs, document, out / "qos.png")),
    }
    return document


#: ``--service-ms`` and ``--instances``: the fixed-service-time model of :func:`prepare_repository`
#: (this benchmark's, and :mod:`loadtest.isolation`'s)
MODEL_OPTIONS: tuple[FieldOption, ...] = (
    ("--service-ms", float, "model service time per request"),
    ("--instances", int, "model instances"),
)


_LOAD_OPTIONS: tuple[FieldOption, ...] = (
    ("--load", float, "offered concurrency / saturating concurrency"),
    ("--premium-fraction", float, "share of the offered concurrency that is premium"),
    (
        "--max-in-flight",
        int,
        "gateway in-flight bound per model (default: the offered concurrency)",
    ),
)
_PROCESS_OPTIONS: tuple[FieldOption, ...] = (("--processes", int, "load-generator processes"),)


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULT_SETTINGS
    parser = argparse.ArgumentParser(
        description="Quality of service by tier: premium P50/P99 and free-tier shed rate at a "
        "multiple of the saturating load, with tier priorities off and on, side by side (real "
        "Triton, real gateways, the platform's load generator). Prints a table, writes qos.json "
        "and qos.png.",
    )
    add_field_options(parser, d, MODEL_OPTIONS + _LOAD_OPTIONS)
    add_run_time_arguments(parser, duration_s=d.duration_s, warmup_s=d.warmup_s, per="run")
    parser.add_argument(
        "--sweep-seconds", type=float, default=d.sweep_s, help="seconds per saturation step"
    )
    parser.add_argument(
        "--impolite", action="store_true", help="clients resend at once after a 429"
    )
    add_field_options(parser, d, _PROCESS_OPTIONS)
    parser.add_argument(
        "--out", type=Path, default=d.out_dir, help="folder for qos.json and qos.png"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench qos``: the parsed options in, the exit status out."""
    settings = settings_from_options(
        DEFAULT_SETTINGS,
        args,
        MODEL_OPTIONS + _LOAD_OPTIONS + _PROCESS_OPTIONS,
        sweep_s=args.sweep_seconds,
        polite=not args.impolite,
        out_dir=args.out,
    )
    document = run_qos(settings)
    print(f"wrote {document['files']['json']} and {document['files']['png']}")
    return 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("qos"))
