"""Smoke test of the KServe parsing benchmark: it runs and prints one row per request shape."""

from __future__ import annotations

import pytest

from loadtest.parse_bench import main


def test_parse_bench_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["request", "body"] and len(lines) == 9
    assert all(float(line.split()[-1]) >= 0 for line in lines[1:])
    # Where each body is checked follows its weight: a binary image on the loop, megabytes of JSON not.
    rows = {line[:34].strip(): line for line in lines[1:]}
    assert (
        "event loop" in rows["UINT8 JPEG of 135 KB, binary"]
        and "a thread" in rows["FP32 1x3x224x224, JSON"]
    )
