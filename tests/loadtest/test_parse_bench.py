"""Smoke test of the KServe parsing benchmark: it runs and prints one row per request shape, then the
event loop's lag while a big JSON body is parsed in each place, then the same for OpenAI embeddings
bodies decoded on the loop or in the parse process."""

from __future__ import annotations

import pytest

from loadtest.registry import run_named


def test_parse_bench_prints_its_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_named("parse", ["--repeat", "1"]) == 0
    shapes, lag, openai = capsys.readouterr().out.strip().split("\n\n")
    lines = shapes.splitlines()
    assert lines[0].split()[:2] == ["request", "body"] and len(lines) == 9
    assert all(float(line.split()[-1]) >= 0 for line in lines[1:])
    # Where each body is checked follows its weight: a binary image on the loop, a small JSON body
    # in a thread, megabytes of JSON in a parse process.
    rows = {line[:34].strip(): line for line in lines[1:]}
    assert "event loop" in rows["UINT8 JPEG of 135 KB, binary"]
    assert "a thread" in rows["FP32 1,000 values, JSON"]
    assert "a process" in rows["FP32 1x3x224x224, JSON"]
    lag_lines = lag.splitlines()
    assert lag_lines[0].split()[:2] == ["JSON", "body"] and len(lag_lines) == 9
    for place in ("event loop", "thread", "process"):
        assert sum(place in line for line in lag_lines[1:]) == 2, place
    assert all(float(line.split()[-1]) >= 0 for line in lag_lines[1:])
    openai_lines = openai.splitlines()
    assert openai_lines[0].split()[:2] == ["embeddings", "MiB"] and len(openai_lines) == 7
    for place in ("event loop", "process"):
        assert sum(place in line for line in openai_lines[1:]) == 2, place
    assert all(float(line.split()[-1]) >= 0 for line in openai_lines[1:])
