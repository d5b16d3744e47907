"""The benchmark's per-process CPU split: groups from this process's tree, cores and ms per request."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from loadtest.bench.cpu_split import cpu_snapshot, cpu_split


def test_split_gives_cores_per_request_and_the_busiest_process() -> None:
    before = {"host": 10.0, "gateway": 1.0, "gateway#11": 0.5, "gateway#12": 0.5}
    after = {"host": 18.0, "gateway": 4.0, "gateway#11": 3.0, "gateway#12": 1.0}
    got = cpu_split(before, after, seconds=2.0, requests=1000)
    assert got["host"]["cores"] == pytest.approx(4.0)
    assert got["gateway"] == pytest.approx(
        {"cores": 1.5, "cpu_ms_per_request": 3.0, "busiest_process_cores": 1.25}
    )
    assert cpu_split({}, after, 2.0, 1000) == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_child_counts_in_its_group() -> None:
    # A child that burns CPU for a while: its command line names no server, so it is the load generator's.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass",
        ]
    )
    try:
        before = cpu_snapshot()
        time.sleep(1.0)
        after = cpu_snapshot()
    finally:
        child.wait()
    got = cpu_split(before, after, seconds=1.0, requests=1)
    assert (
        got["load generator"]["cores"] > 0.3
        and got["host"]["cores"] >= got["load generator"]["cores"] * 0.8
    )
