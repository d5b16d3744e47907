"""The GPU benchmark's budget and ordering (``python -m loadtest.bench.gpu --budget-s``), without a GPU.

Unit tests of the planning functions: points run in the order given, what does not fit is a row that
says so (never a silent skip, never a figure), the sweep measures the loaded config first, and the
report prints rows that were not run or not measured. The whole run is dry-run on the CPU by
``loadtest/gpu_bench.sh all`` (see its header), not here: it takes minutes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.bench.gpu import GpuBenchSettings, build_parser
from loadtest.bench.gpu_goals import evaluate_targets
from loadtest.bench.gpu_report import print_gpu_report
from loadtest.bench.gpu_run import _not_run, _point_cost, _points, paired
from loadtest.bench.gpu_setup import PIPELINE, TENSOR, Clock, _candidates
from loadtest.bench.settings import Result
from loadtest.loadgen.capacity import TWIN_INSTANCES, twin_config


def _row(config: str, concurrency: int, throughput: float, p99_ms: float) -> Result:
    return Result(
        config=config,
        concurrency=concurrency,
        requests=100,
        errors=0,
        duration_s=1.0,
        throughput=throughput,
        p50_ms=p99_ms / 2,
        p95_ms=p99_ms,
        p99_ms=p99_ms,
        mean_ms=p99_ms / 2,
        capacity=10 * throughput,
    )


def test_points_keep_the_given_order_and_unknown_names(tmp_path: Path) -> None:
    settings = GpuBenchSettings(
        out_dir=tmp_path, points={"jpeg": (64, 32), "tensor http": (32,), "nonsense": (8,)}
    )
    assert _points(settings, {"jpeg": None, "tensor http": None}) == [  # type: ignore[dict-item]
        ("jpeg", 64),
        ("jpeg", 32),
        ("tensor http", 32),
        ("nonsense", 8),
    ]
    assert (
        _point_cost(settings, capacity=True)
        > _point_cost(settings, capacity=False)
        > settings.duration_s
    )


def test_gateway_points_are_measured_beside_their_direct_twin_in_alternating_order(
    tmp_path: Path,
) -> None:
    settings = GpuBenchSettings(
        out_dir=tmp_path,
        points={"jpeg": (32, 64, 128), "tensor http": (32,), "jpeg gateway": (32, 64, 128, 256)},
    )
    assert _points(settings, {}) == [
        ("jpeg", 32),
        ("jpeg gateway", 32),
        ("jpeg gateway", 64),
        ("jpeg", 64),
        ("jpeg", 128),
        ("jpeg gateway", 128),
        ("tensor http", 32),
        ("jpeg gateway", 256),  # no direct twin asked for: where it was
    ]
    # A pair goes where the earlier of its two points was; nothing is lost or measured twice.
    points = [("jpeg gateway", 64), ("naive", 32), ("jpeg", 64), ("jpeg", 32)]
    assert paired(points) == [("jpeg", 64), ("jpeg gateway", 64), ("naive", 32), ("jpeg", 32)]


def test_budget_flag_and_clock() -> None:
    args = build_parser().parse_args(
        ["--out", "x", "--budget-s", "100", "--points", "jpeg=64;tensor http=32"]
    )
    assert args.budget_s == 100
    clock = Clock(100.0)
    assert clock.fits(50) and not clock.fits(50, reserve=60) and not clock.fits(101)
    assert Clock(0).fits(1e9)  # no budget: everything fits


def test_a_point_not_run_is_an_error_row_not_a_figure() -> None:
    rows = [
        _row("jpeg", 64, 6000.0, 15.0),
        _not_run("jpeg gateway", 64, "the run's time budget of 100 s was spent"),
    ]
    targets = evaluate_targets(rows)
    assert targets["jpeg_direct"]["met"] is True
    assert targets["jpeg_gateway"]["met"] is False  # a row that did not run counts as nothing
    assert rows[1].errors == 1 and rows[1].throughput == 0 and "not run" in rows[1].error_messages


def test_sweep_measures_the_built_config_first() -> None:
    base = {
        "instance_group": [{"count": 1}],
        "max_batch_size": 128,
        "dynamic_batching": {
            "max_queue_delay_microseconds": 1000,
            "preferred_batch_size": [32, 64, 128],
        },
    }
    candidates = _candidates(PIPELINE, base, quick=False)
    assert candidates[0] == {
        "instances": 1,
        "max_queue_delay_us": 1000,
        "preferred_batch_sizes": [32, 64, 128],
        "queue_policies": True,
    }
    # Choosable candidates next (a budgeted run decides among them): more processes first.
    assert [c["instances"] for c in candidates[1:3]] == [2, 3]
    assert all(c["queue_policies"] for c in candidates[:3])
    # What the queue policies cost is measured after them, on the built config; never chosen.
    assert {**candidates[0], "queue_policies": False} in candidates[3:]
    assert len(candidates) == len({str(c) for c in candidates})  # the built config not twice
    assert len(_candidates(TENSOR, base, quick=True)) == 2


def test_report_prints_rows_not_run_and_candidates_not_measured(tmp_path: Path) -> None:
    rows = [
        _row("jpeg", 64, 6000.0, 15.0),
        _not_run("naive", 32, "the run's time budget of 100 s was spent"),
    ]
    document = {
        "machine": {},
        "targets": evaluate_targets(rows),
        "jpeg_profile": [
            {
                "batch": 64,
                "ms_per_batch": {"decode": 3.8},
                "serial_images_per_s": 6000.0,
                "chunk": 32,
                "pipelined_ms_per_batch": 6.0,
                "pipelined_images_per_s": 10666.0,
            }
        ],
        "sweep": [
            {
                "entry": PIPELINE,
                "concurrency": 64,
                "chosen": {"instances": 1},
                "rule": "best",
                "candidates": [
                    {
                        "instances": 1,
                        "max_queue_delay_us": 1000,
                        "preferred_batch_sizes": [],
                        "measured": True,
                        "throughput": 6000.0,
                        "p99_ms": 15.0,
                        "errors": 0,
                    },
                    {
                        "instances": 2,
                        "max_queue_delay_us": 1000,
                        "preferred_batch_sizes": [],
                        "measured": False,
                        "reason": "the run's time budget would be spent",
                    },
                ],
            }
        ],
    }
    print_gpu_report(rows, document, tmp_path / "bench.txt")
    text = (tmp_path / "bench.txt").read_text()
    assert "not measured (the run's time budget would be spent)" in text
    assert "naive at concurrency 32: not run" in text and "pipelined in chunks of 32" in text


def test_points_name_each_configuration_once() -> None:
    args = build_parser().parse_args(["--out", "x", "--points", "jpeg=64,32;tensor http=32"])
    assert args.points == {"jpeg": (64, 32), "tensor http": (32,)}
    with pytest.raises(SystemExit):  # a second "jpeg=" would silently replace the first list
        build_parser().parse_args(["--out", "x", "--points", "jpeg=64;tensor http=32;jpeg=96"])


def test_the_instant_twin_keeps_the_batching_not_the_queue_policy() -> None:
    config = {
        "max_batch_size": 64,
        "input": [],
        "output": [],
        "platform": "pytorch_libtorch",
        "dynamic_batching": {
            "max_queue_delay_microseconds": 100,
            "preferred_batch_size": [32],
            "priority_levels": 3,
            "default_queue_policy": {"max_queue_size": 64},
        },
    }
    twin = twin_config(config, "m__instant")
    assert twin["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100,
        "preferred_batch_size": [32],
    }
    assert "platform" not in twin and twin["backend"] == "python"
    # Several stubs, inputs left where they are: the twin must not be what bounds the capacity.
    assert twin["instance_group"] == [{"count": TWIN_INSTANCES, "kind": "KIND_CPU"}]
    assert twin["parameters"] == {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"}}


def test_a_request_of_8_images_counts_as_8_images() -> None:
    from types import SimpleNamespace

    from loadtest.bench.gpu_report import result_row

    result = SimpleNamespace(
        concurrency=32,
        requests=100,
        errors=0,
        duration_s=1.0,
        throughput=100.0,
        p50_ms=1.0,
        p95_ms=2.0,
        p99_ms=3.0,
        mean_ms=1.0,
        error_rate=0.0,
        error_summary=lambda: "",
        tail_burst=0.5,
    )
    batched = result_row("tensor cuda-shm x8", result, 200.0, 8)
    assert (batched.throughput, batched.capacity, batched.capacity_used) == (800.0, 1600.0, 0.5)
    assert result_row("tensor cuda-shm", result, 200.0).throughput == 100.0
    assert batched.tail_burst == 0.5  # the load's own figure, whatever the images per request


def test_the_jpeg_target_takes_any_jpeg_entry_and_the_gateway_its_own() -> None:
    rows = [
        _row("jpeg", 64, 4870.0, 21.1),
        _row("jpeg", 32, 3478.0, 13.6),
        _row("jpeg compiled", 64, 5284.0, 19.9),
        _row("jpeg compiled", 128, 6877.0, 31.5),
        _row("jpeg gateway", 32, 2352.0, 34.8),
    ]
    targets = evaluate_targets(rows)
    assert targets["jpeg_direct"]["met"] is True
    assert targets["jpeg_direct"]["figure"]["config"] == "jpeg compiled"
    assert (
        targets["jpeg_direct"]["figure"]["images_per_s"] == 5284.0
    )  # not the faster row over the P99 bar
    gateway = targets["jpeg_gateway"]["figure"]
    assert gateway["concurrency"] == 32 and gateway["ratio"] == pytest.approx(2352.0 / 3478.0)


def test_issue_28_goals_compare_the_served_path_with_its_in_process_reference() -> None:
    from loadtest.bench.jpeg_reference import INPROCESS_OVERLAPPED

    rows = [
        replace(_row(INPROCESS_OVERLAPPED, 0, 15000.0, 4.3), batch=64),
        _row("jpeg compiled overlap", 32, 9000.0, 9.0),
        _row("jpeg compiled overlap", 64, 12500.0, 15.0),
        _row("jpeg compiled overlap", 128, 12600.0, 29.0),
        _row("jpeg compiled", 64, 6000.0, 18.0),
    ]
    rows[1] = replace(rows[1], capacity=30000.0)
    rows[2] = replace(rows[2], capacity=20000.0)
    targets = evaluate_targets(rows)
    assert targets["inprocess_jpeg"]["met"] is True
    share = targets["jpeg_vs_inprocess"]
    # The best served row within P99 <= 20 ms, against the in-process rate.
    assert share["figure"]["config"] == "jpeg compiled overlap"
    assert share["figure"]["share"] == pytest.approx(12500.0 / 15000.0) and share["met"] is True
    past = targets["jpeg_past_saturation"]["figure"]
    # 64 saturates (within 10% of the best, 12,600/s); 128 is twice it: throughput held, P99 < 2x.
    assert past["saturating_concurrency"] == 64
    assert past["throughput_ratio"] == pytest.approx(12600.0 / 12500.0)
    assert targets["jpeg_past_saturation"]["met"] is True
    headroom = targets["client_headroom"]
    assert headroom["figure"]["ratio"] == pytest.approx(20000.0 / 12500.0)
    assert headroom["met"] is False


def test_past_saturation_is_judged_on_the_fastest_entry_with_its_refusals_counted() -> None:
    # H100 run 13's shape: no row within P99 <= 20 ms, and at 2x the saturating concurrency the
    # entry's bounded queue refused requests while the answered throughput held.
    rows = [
        _row("jpeg", 64, 4582.0, 22.9),
        _row("jpeg", 128, 5598.0, 38.5),
        _row("jpeg", 256, 6261.0, 68.7),
        replace(_row("jpeg", 512, 6233.0, 106.7), errors=9357),
    ]
    past = evaluate_targets(rows)["jpeg_past_saturation"]
    assert past["figure"]["saturating_concurrency"] == 256  # 128 is more than 10% below the best
    assert past["figure"]["doubled_refused"] == 9357
    assert past["figure"]["p99_ratio"] == pytest.approx(106.7 / 68.7)
    assert past["met"] is True
    # Refusals at every point: nothing saturates without them, so nothing is judged.
    refusing = [replace(r, errors=1) for r in rows]
    assert evaluate_targets(refusing)["jpeg_past_saturation"]["met"] is None


def test_the_scripts_points_parse_and_name_known_configurations(tmp_path: Path) -> None:
    import re

    script = (Path(__file__).parents[2] / "loadtest" / "gpu_bench.sh").read_text(encoding="utf-8")
    found = re.search(
        r'^ALL_POINTS=\$\{ALL_POINTS:-"(.*)"\}$', script, re.M
    )  # the default, when not set
    assert found is not None
    points = build_parser().parse_args(["--out", "x", "--points", found.group(1)]).points
    assert set(points) <= set(GpuBenchSettings(out_dir=tmp_path).points)


def test_a_failed_capacity_run_leaves_the_point_measured_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The client's capacity is a side figure: its failure must not cost the run its points."""
    from types import SimpleNamespace

    import numpy as np

    from loadtest.bench import gpu_run
    from loadtest.loadgen import LoadError
    from loadtest.loadgen.targets import TritonTarget

    def refused(*args: object, **kwargs: object) -> None:
        raise LoadError("measuring the load generator's capacity failed: the twin refused it")

    answered = SimpleNamespace(
        concurrency=8, requests=80, errors=0, duration_s=1.0, throughput=80.0, p50_ms=1.0,
        p95_ms=2.0, p99_ms=3.0, mean_ms=1.5, error_rate=0.0, error_summary=lambda: "",
        tail_burst=None,
    )  # fmt: skip
    monkeypatch.setattr(gpu_run, "measure_capacity", refused)
    monkeypatch.setattr(gpu_run, "run_load", lambda spec, processes: answered)
    monkeypatch.setattr(gpu_run, "PointProbe", SimpleNamespace(start=lambda *a, **k: None))
    target = TritonTarget(
        url="127.0.0.1:9", model="m", inputs=({"INPUT": np.zeros((1, 3), np.float32)},), name="jpeg"
    )
    run = gpu_run._Run(GpuBenchSettings(out_dir=tmp_path), Clock(0.0), {})
    servers = gpu_run._Servers(
        SimpleNamespace(  # type: ignore[arg-type]
            http_url="127.0.0.1:9", metrics_url="http://127.0.0.1:9/metrics"
        ),
        None,
        {"jpeg": target},
        {PIPELINE: "p__instant", TENSOR: "t__instant"},
    )
    gpu_run._point(run, servers, {}, "jpeg", 8)
    assert [r.throughput for r in run.results] == [80.0]
    assert run.results[0].capacity is None
    assert "the twin refused it" in run.document["capacity_errors"]["jpeg at 8"]
