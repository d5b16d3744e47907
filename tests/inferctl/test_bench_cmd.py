"""``inferctl bench``: one entry for every registered benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferctl.cli import main
from loadtest.registry import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]


def test_bench_help_lists_every_benchmark_with_its_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse may wrap
    for benchmark in BENCHMARKS:
        assert f"{benchmark.name} {' '.join(benchmark.summary.split())}" in out


def test_a_benchmarks_help_is_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "qos", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: inferctl bench qos")
    assert "--premium-fraction" in out


def test_an_unknown_benchmark_is_refused_with_the_known_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "no-such-bench"])
    assert exited.value.code == 2
    assert "'isolation'" in capsys.readouterr().err


def test_bench_options_reach_the_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "parse", "--repeat", "many"])
    assert exited.value.code == 2
    assert "inferctl bench parse: error: argument --repeat" in capsys.readouterr().err


def test_listing_the_benchmarks_imports_none_of_them() -> None:
    """``inferctl bench --help`` reads the registry only: no benchmark module, no torch."""
    modules = [b.module for b in BENCHMARKS]
    probe = (
        "import contextlib, io, sys\n"
        "from inferctl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['bench', '--help'])\n"
        f"print(sorted(m for m in {modules!r} + ['torch'] if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"
