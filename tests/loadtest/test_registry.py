"""The benchmark registry: every name resolves to a module with ``build_parser`` and ``run``, and each
module's ``python -m`` entry goes through the registry under its own name."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.registry import BENCHMARKS, find, names, run_named


def test_names_are_unique_and_every_benchmark_says_what_it_measures() -> None:
    assert len(set(names())) == len(BENCHMARKS)
    for benchmark in BENCHMARKS:
        assert benchmark.summary.strip(), benchmark.name


@pytest.mark.parametrize("name", names())
def test_every_benchmark_resolves_and_builds_its_parser(name: str) -> None:
    benchmark = find(name)
    module = benchmark.load()
    assert callable(module.run), name
    parser = benchmark.parser()
    assert isinstance(parser, argparse.ArgumentParser)
    assert parser.prog == f"inferctl bench {name}"
    assert parser.format_help().startswith(f"usage: inferctl bench {name}")


@pytest.mark.parametrize("name", names())
def test_the_module_entry_goes_through_the_registry_by_its_own_name(name: str) -> None:
    """``python -m loadtest.X`` runs ``run_named("<X's name>")``, and the old ``main`` is gone."""
    spec = importlib.util.find_spec(find(name).module)
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin)
    tree = ast.parse(path.read_text())
    assert not any(
        isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body
    ), path
    sources = [path.read_text()]
    if path.name == "cli.py":  # the package's entry: python -m loadtest.bench
        sources.append((path.parent / "__main__.py").read_text())
    assert any(f'run_named("{name}")' in source for source in sources), path


@pytest.mark.parametrize(
    ("module", "name"), [("loadtest.bench", "platform"), ("loadtest.qos", "qos")]
)
def test_python_m_runs_the_registered_benchmark(module: str, name: str) -> None:
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith(f"usage: inferctl bench {name}")


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="qos"):
        find("no-such-bench")


def test_a_forwarding_benchmark_keeps_the_options_it_does_not_know() -> None:
    args = find("gpu-embeddings").parse(["--out", "o", "--rounds", "2", "--no-ragged"])
    assert str(args.out) == "o"
    assert args.forwarded == ["--rounds", "2", "--no-ragged"]


def test_an_unknown_option_of_another_benchmark_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_named("parse", ["--rounds", "2"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --rounds 2" in capsys.readouterr().err


def test_options_that_do_not_fit_together_are_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A benchmark's ``UsageError`` is reported as argparse reports a bad option: status 2."""
    monkeypatch.delenv("GATEWAY_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exited:
        run_named("gateway", ["--model", "m"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: inferctl bench gateway")
    assert "inferctl bench gateway: error: an API key is needed" in err
