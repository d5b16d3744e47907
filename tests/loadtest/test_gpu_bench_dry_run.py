"""The GPU benchmark's machinery end to end on the CPU: real builds, a real Triton, the real load
generator; every point answered, every table and file written. Its figures mean nothing here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.bench.gpu import GpuBenchSettings, run_gpu_bench


@pytest.mark.integration
@pytest.mark.slow
def test_a_cpu_dry_run_answers_every_point_and_writes_every_file(tmp_path: Path) -> None:
    settings = GpuBenchSettings(
        out_dir=tmp_path,
        device="cpu",
        compiled="",
        sweep=False,
        quick=True,
        clients=1,
        duration_s=2.0,
        warmup_s=1.0,
        capacity_s=0.5,
        points={
            "jpeg": (2,),
            "jpeg overlap": (2,),
            "tensor http": (2,),
            "tensor system-shm": (2,),
            "jpeg gateway": (2,),
        },
    )
    document = run_gpu_bench(settings)
    rows = {r["config"]: r for r in document["results"]}
    assert set(rows) == {"jpeg", "jpeg overlap", "tensor http", "tensor system-shm", "jpeg gateway"}
    for name, row in rows.items():
        assert row["errors"] == 0 and row["requests"] > 0, (name, row)
        assert row["capacity"] and row["capacity"] > 0, name
    assert (
        document["sanity"]["tensor_top1_agreement"] == 1.0
        and document["sanity"]["jpeg_top1_agreement"] == 1.0
    )
    split = {r["config"]: r for r in document["triton_split"]}
    assert set(split) == set(rows) and all(
        r["requests"] > 0 and r["compute_infer_ms"] > 0 for r in split.values()
    )
    assert all(r["cpu"]["host"]["cores"] > 0 for r in split.values())
    # The gateway's point is also split by the gateway's own stages.
    stages = split["jpeg gateway"]["gateway"]
    assert stages["requests"] > 0 and stages["upstream_ms"] > 0 and stages["parse_ms"] > 0
    assert [r["config"] for r in split.values() if "gateway" in r] == ["jpeg gateway"]
    # The JPEG pipeline times its own steps (Triton's metrics), and so does the tensor entry's
    # backend (the batching core's; nothing to wait for on the CPU).
    assert set(split["jpeg"]["steps_ms"]) == {
        "inputs",
        "decode",
        "queue_gpu",
        "wait_gpu",
        "respond",
    }
    assert split["jpeg"]["steps_ms"]["decode"] > 0
    assert set(split["tensor http"]["steps_ms"]) == {"inputs", "run", "wait", "respond"}
    assert split["tensor http"]["steps_ms"]["run"] > 0
    # The overlapped entry answers from its pipeline's thread and times the same steps there.
    assert split["jpeg overlap"]["steps_ms"]["decode"] > 0
    assert {"bench.json", "bench.txt", "bench.png", "machine.json"} <= {
        p.name for p in tmp_path.iterdir()
    }
    text = (tmp_path / "bench.txt").read_text(encoding="utf-8")
    assert (
        "Where the time goes" in text
        and "Who used the CPUs" in text
        and "Where the gateway's time goes" in text
    )
    assert "Inside execute()" in text
    assert json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))["targets"][
        "jpeg_direct"
    ]["figure"]
