"""The monitoring and autoscaling queries against real metrics: real Triton, real load, real Prometheus.

1. The KEDA query (the queue time per client request) is evaluated by a real Prometheus on a TSDB
   built (``promtool tsdb create-blocks-from openmetrics``) from two real scrapes of Triton's
   ``/metrics``, taken on a fresh server before and after the platform's load generator drove the
   ``image_classifier`` ensemble. It must equal what Triton's statistics extension reports for the
   same interval: every model's queue time (the ensemble's steps carry it) per request clients made.
   The queries it replaces are evaluated beside it, and shown wrong.
2. Every metric name the alert rules, the dashboard and the KEDA query use appears in a real scrape of
   the gateway (after admitted, failed and rate-limited requests) or of Triton; GPU metrics, which a
   CPU host does not export, must be named in the Triton server library itself.

The scrapes carry the ``namespace`` label the Prometheus Operator adds to every target (the queries
select on it). Figures are printed, not asserted beyond the comparison.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from loadtest.loadgen import LoadSpec, TritonTarget, run_load
from loadtest.payloads import jpeg_images
from serving.launcher import TritonPorts, TritonServer
from serving.ports import reserve_port
from serving.processes import ManagedProcess
from tests.support.gateway_procs import METRICS_HEADERS, create_key, start_gateway
from tests.support.k8s_render import find, rendered

pytestmark = pytest.mark.integration

ENSEMBLE = "image_classifier"
MODELS = [ENSEMBLE, "image_preprocess", "efficientnet_lite0", "image_postprocess"]
NAMESPACE = "inference"


@dataclass(frozen=True)
class Scrape:
    at: float  # Unix seconds
    text: str
    stats: dict[
        str, dict[str, int]
    ]  # model -> {"queue_ns", "success"} from the statistics extension


def _stats(server: TritonServer) -> dict[str, dict[str, int]]:
    with urllib.request.urlopen(
        f"http://{server.http_url}/v2/models/stats", timeout=10
    ) as response:
        body = json.load(response)
    return {
        m["name"]: {
            "queue_ns": int(m["inference_stats"]["queue"]["ns"]),
            "success": int(m["inference_stats"]["success"]["count"]),
        }
        for m in body["model_stats"]
    }


def _scrape(server: TritonServer) -> Scrape:
    # Triton updates statistics after a response has left: wait until the ensemble and each of its
    # steps count the same requests (they must, for classify traffic alone) and stay put.
    deadline = time.monotonic() + 20
    stats = _stats(server)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = _stats(server)
        if again == stats and len({again[m]["success"] for m in MODELS}) == 1:
            break
        stats = again
    at = time.time()
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    assert _stats(server) == stats, "Triton's counters moved during the scrape"
    return Scrape(at, text, stats)


@pytest.fixture(scope="module")
def classify_triton(model_repository: Path) -> Iterator[TritonServer]:
    """A fresh Triton (counters at zero) serving the classifier ensemble and its steps."""
    server = TritonServer(model_repository, models=MODELS, ports=TritonPorts.free())
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def scrapes(classify_triton: TritonServer) -> tuple[Scrape, Scrape]:
    """Triton's /metrics and statistics before and after real load through the ensemble."""
    before = _scrape(classify_triton)
    images = jpeg_images(max_side=320)
    target = TritonTarget(
        url=classify_triton.http_url,
        model=ENSEMBLE,
        inputs=tuple({"IMAGE": np.array([[jpeg]], dtype=np.object_)} for jpeg in images),
        outputs=("CLASS_IDS",),
    )
    result = run_load(LoadSpec(target=target, concurrency=8, duration_s=6.0, warmup_s=0.0))
    print(f"\n[keda] load: {result.throughput:.1f} requests/s through {ENSEMBLE} at concurrency 8")
    after = _scrape(classify_triton)
    assert after.stats[ENSEMBLE]["success"] - before.stats[ENSEMBLE]["success"] >= 10
    return before, after


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")


def _samples(text: str) -> list[tuple[str, str, str]]:
    """(name, labels as written, value) of each sample line of a Prometheus text exposition, names
    exactly as exported (a parser library would add ``_total`` to Triton's counters)."""
    out = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            out.append((match.group(1), match.group(2) or "", match.group(3)))
    return out


def _openmetrics(scrapes: tuple[Scrape, ...]) -> str:
    """The scrapes as one OpenMetrics file with timestamps, the namespace label added, each series'
    samples together and in time order."""
    series: dict[str, list[str]] = {}
    for scrape in scrapes:
        for name, labels, value in _samples(scrape.text):
            body = f'namespace="{NAMESPACE}"' + (f",{labels}" if labels else "")
            series.setdefault(f"{name}{{{body}}}", []).append(
                f"{name}{{{body}}} {value} {scrape.at:.3f}"
            )
    families: dict[str, list[str]] = {}
    for key in sorted(series):
        families.setdefault(key.split("{", 1)[0], []).extend(series[key])
    return "\n".join(line for name in sorted(families) for line in families[name]) + "\n# EOF\n"


class Prometheus:
    """A real Prometheus server on a TSDB directory, bound to 127.0.0.1."""

    def __init__(self, data: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip(
                "prometheus is not installed: `./run test` installs Debian's prometheus package"
            )
        (data.parent / "prometheus.yml").write_text("global: {}\n")
        self.port = reserve_port()
        self.process = ManagedProcess(
            [
                binary,
                f"--config.file={data.parent / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            name="prometheus",
        )

    def __enter__(self) -> Prometheus:
        self.process.start()
        self.process.wait_http(f"http://127.0.0.1:{self.port}/-/ready", 60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

    def query(self, expr: str, at: float) -> float | None:
        params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/api/v1/query?{params}", timeout=30
        ) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def prometheus(
    scrapes: tuple[Scrape, Scrape], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: `./run test` installs Debian's prometheus package")
    root = tmp_path_factory.mktemp("prometheus")
    (root / "scrapes.om").write_text(_openmetrics(scrapes))
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(root / "scrapes.om"),
            str(root / "data"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    with Prometheus(root / "data") as server:
        yield server


def _keda_query() -> str:
    return str(
        find(rendered("base"), "ScaledObject", "triton")["spec"]["triggers"][0]["metadata"]["query"]
    )


def test_keda_query_is_the_queue_time_triton_reports_per_client_request(
    scrapes: tuple[Scrape, Scrape], prometheus: Prometheus
) -> None:
    before, after = scrapes
    client_requests = after.stats[ENSEMBLE]["success"] - before.stats[ENSEMBLE]["success"]
    queue_us = sum(after.stats[m]["queue_ns"] - before.stats[m]["queue_ns"] for m in MODELS) / 1000
    expected = queue_us / client_requests

    keda = prometheus.query(_keda_query(), after.at)
    every_model = prometheus.query(
        f'sum(rate(nv_inference_queue_duration_us{{namespace="{NAMESPACE}"}}[1m])) '
        f'/ sum(rate(nv_inference_request_success{{namespace="{NAMESPACE}"}}[1m]))',
        after.at,
    )
    client_facing_only = prometheus.query(
        f'sum(rate(nv_inference_queue_duration_us{{namespace="{NAMESPACE}",model="{ENSEMBLE}"}}[1m])) '
        f'/ sum(rate(nv_inference_request_success{{namespace="{NAMESPACE}",model="{ENSEMBLE}"}}[1m]))',
        after.at,
    )
    own = {
        m: (after.stats[m]["queue_ns"] - before.stats[m]["queue_ns"]) / 1000 / client_requests
        for m in MODELS
    }
    print(
        f"[keda] {client_requests} classify requests; Triton statistics: {expected:,.0f} us queued "
        f"per request ({', '.join(f'{m} {v:,.0f}' for m, v in own.items())})"
    )
    assert keda is not None and every_model is not None and client_facing_only is not None
    print(
        f"[keda] Prometheus: KEDA query {keda:,.0f} us; all models' successes as denominator "
        f"{every_model:,.0f} us; the ensemble's own queue time {client_facing_only:,.1f} us"
    )
    assert keda == pytest.approx(expected, rel=0.01)
    # What it replaces: every step counted again as a request (about a quarter for a 3-step ensemble),
    # and the ensemble's own queue time, which is ~1 us: its requests wait in the steps' queues.
    assert every_model < 0.5 * keda
    assert client_facing_only < 0.01 * keda


def test_keda_query_reads_zero_when_idle(
    scrapes: tuple[Scrape, Scrape], prometheus: Prometheus
) -> None:
    """Before the first request (counters flat) the query answers 0, not NaN or nothing."""
    before, _ = scrapes
    assert prometheus.query(_keda_query(), before.at) == 0


# --- metric names -----------------------------------------------------------------------------------

_NAME = re.compile(r"(?<![:\w])((?:nv|gateway)_[a-z0-9_]+)")


def _used_names() -> set[str]:
    docs = rendered("base")
    rules = find(docs, "PrometheusRule", "triton-platform-slo")["spec"]["groups"]
    exprs = [r["expr"] for g in rules for r in g["rules"]] + [_keda_query()]
    dashboard = json.loads(
        (
            Path(__file__).resolve().parents[2] / "k8s/base/dashboards/triton-platform.json"
        ).read_text()
    )
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {m for e in exprs for m in _NAME.findall(e)}


def _exported(text: str) -> set[str]:
    return {name for name, _, _ in _samples(text)}


def _triton_library_names() -> set[str]:
    import pytriton

    libs = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    (library,) = libs.glob("libtritonserver*.so*")
    return {m.decode() for m in re.findall(rb"nv_gpu_[a-z_]+", library.read_bytes())}


def test_every_metric_name_used_is_one_the_platform_exports(
    scrapes: tuple[Scrape, Scrape], classify_triton: TritonServer, tmp_path: Path
) -> None:
    gateway = start_gateway(tmp_path, classify_triton.http_url, max_client_labels=10)
    try:
        headers, _ = create_key(gateway, tier="tiny")  # burst 4: the rest are rate limited
        image = jpeg_images(max_side=320)[0]
        statuses = [
            httpx.post(
                f"{gateway.url}/v1/classify",
                files={"file": ("cat.jpg", image, "image/jpeg")},
                headers=headers,
                timeout=60,
            ).status_code
            for _ in range(6)
        ]
        assert 200 in statuses and 429 in statuses, statuses
        text = httpx.get(f"{gateway.url}/metrics", headers=METRICS_HEADERS, timeout=10).text
    finally:
        gateway.stop()
    exported = _exported(text) | _exported(scrapes[1].text)
    used = _used_names()
    assert {
        "gateway_request_duration_seconds_bucket",
        "gateway_rejected_requests_total",
        "nv_inference_queue_duration_us",
        "nv_gpu_utilization",
    } <= used
    missing = used - exported
    # A CPU host exports no GPU metrics; those must be names the Triton server itself defines.
    gpu_only = {name for name in missing if name.startswith("nv_gpu_")}
    assert missing - gpu_only == set(), f"used but not exported: {sorted(missing - gpu_only)}"
    assert gpu_only <= _triton_library_names(), (
        f"not defined by Triton: {sorted(gpu_only - _triton_library_names())}"
    )
    print(
        f"[metrics] {len(used)} names used by rules, dashboard and KEDA; all exported "
        f"({len(gpu_only)} GPU-only, found in the Triton library)"
    )
