"""The GPU diffusion benchmark (``loadtest.diffusion_process``) on this CPU with the tiny checkpoint.

The GPU run (``loadtest/diffusion_gpu.sh OUT --budget-s 120``) is this code path with the SD 1.5
configuration in FP16; here it runs whole on the tiny checkpoint in FP32, where the served pipeline
code and diffusers compute the same images. The budget's planning is checked without timing
anything: what does not fit is a row that says so, never a figure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.diffusion_process import plan
from loadtest.diffusion_process_report import Measured, results_summary, results_table
from loadtest.registry import run_named

pytestmark = pytest.mark.integration

#: see tests/builders/test_diffusion.py (0 measured for the torch path on a CPU)
PIXEL_TOLERANCE = 2


def test_points_run_in_priority_order() -> None:
    points = plan([(512, 512, 25), (768, 768, 50)], [1, 4, 8], (768, 768, 25))
    assert [(p.size, p.steps, p.concurrency, p.switch) for p in points] == [
        ("512x512", 25, 1, False),
        ("512x512", 25, 4, False),  # alone (parity, the 1.1x target), batched
        ("768x768", 25, 1, True),  # the first request after a change of size
        ("768x768", 50, 1, False),
        ("512x512", 25, 8, False),
        ("768x768", 50, 4, False),
        ("768x768", 50, 8, False),
    ]
    assert points[2].came_from == (
        512,
        512,
    )  # its first timed call comes right after one at the first size


def test_a_switch_to_the_first_size_is_refused() -> None:
    # It would run after that size's points: its "first request" would find everything warm.
    with pytest.raises(ValueError, match="must be a size other than the first"):
        plan([(768, 768, 50), (512, 512, 25)], [1, 4], (768, 768, 25))


def test_a_point_not_run_is_a_row_and_no_target() -> None:
    rows = [
        Measured("512x512", 25, 1, rounds=1, seconds={"served": [2.0], "diffusers": [2.5]}),
        Measured("768x768", 50, 4, not_run="about 40 s needed, 12 s left"),
        Measured("768x768", 25, 1, switch=True, not_run="about 9 s needed, 2 s left"),
    ]
    text = results_table(rows, "cpu").plain()
    assert "this point not run: about 40 s needed, 12 s left" in text
    assert "the change of size not run: about 9 s needed, 2 s left" in text
    summary = results_summary(rows, {"served": {}, "diffusers": {}})
    assert [t["met"] for t in summary["targets"]] == [True] and summary["targets"][0][
        "value"
    ] == 0.8
    assert summary["switches"] == []


def test_the_run_on_the_tiny_checkpoint(sd_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        run_named(
            "diffusion-inprocess",
            [
                "--out",
                str(out),
                "--checkpoint",
                str(sd_checkpoint),
                "--device",
                "cpu",
                "--sizes",
                "64x64:2",
                "--concurrency",
                "1,2",
                "--switch",
                "72x72:2",
                "--rounds",
                "1",
                "--workdir",
                str(tmp_path / "work"),
            ],
        )
        == 0
    )
    body = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    measured = [(p["size"], p["concurrency"], p["switch"], p["not_run"]) for p in body["points"]]
    assert measured == [("64x64", 1, False, ""), ("64x64", 2, False, ""), ("72x72", 1, True, "")]
    assert all(
        len(p["seconds"]["served"]) == len(p["seconds"]["diffusers"]) == p["rounds"]
        for p in body["points"]
    )
    # Every image both made, same seed: the served code is diffusers' computation.
    assert sorted(p["image"] for p in body["parity"]) == [
        "64x64/2/c1/seed1000",
        "64x64/2/c2/seed1000",
        "64x64/2/c2/seed1001",
    ]
    assert all(
        p["max_abs_error"] <= PIXEL_TOLERANCE and p["served_std"] > 1.0 for p in body["parity"]
    )
    assert {s["system"] for s in body["switches"]} == {"served", "diffusers"}
    assert len(body["targets"]) == 3 and body["setup"]["entry"]["precision"] == "fp32"
    assert "Targets:" in (out / "bench.txt").read_text(encoding="utf-8")


def test_the_slim_diffusers_keeps_what_the_run_imports(tmp_path: Path) -> None:
    import zipfile

    from loadtest._slim_diffusers import slim

    names = [
        "diffusers/__init__.py",
        "diffusers/pipelines/__init__.py",
        "diffusers/pipelines/pipeline_utils.py",
        "diffusers/pipelines/stable_diffusion/pipeline_stable_diffusion.py",
        "diffusers/schedulers/scheduling_pndm.py",
        "diffusers/pipelines/flux/pipeline_flux.py",
        "diffusers/modular_pipelines/__init__.py",
        "diffusers-0.42.1.dist-info/METADATA",
    ]
    wheel = tmp_path / "diffusers-0.42.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for name in names:
            out.writestr(name, "# " + name)
    with zipfile.ZipFile(slim(wheel, tmp_path / "slim.zip")) as made:
        kept = set(made.namelist())
    assert kept == set(names) - {
        "diffusers/pipelines/flux/pipeline_flux.py",
        "diffusers/modular_pipelines/__init__.py",
    }
