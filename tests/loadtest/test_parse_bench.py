"""Smoke test of the KServe parsing benchmark: it runs and prints one row per request shape."""

from __future__ import annotations

import pytest

from loadtest.parse_bench import main


def test_parse_bench_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["request", "body"] and len(lines) == 5
    assert all(float(line.split()[-1]) >= 0 for line in lines[1:])
