"""The ``inferctl`` command line: its commands and its answers to bad input."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders.build_cache import CACHE_ENV
from inferctl.build_cmd import parse_weights
from inferctl.cli import build_parser, main
from serving.console import (
    JSON_SCHEMA,
    MAX_LINE_CHARS,
    Table,
    heading,
    json_document,
    make_console,
    print_table,
)


def test_every_command_is_registered() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {"build", "up", "promote", "history", "bench"}


def test_build_of_an_unknown_model_names_it_and_touches_nothing(tmp_path, capsys) -> None:
    repository = tmp_path / "repo"
    assert main(["build", "no_such_model", "--repository", str(repository)]) == 1
    assert "unknown model 'no_such_model'" in capsys.readouterr().err
    assert not repository.exists()


def test_weights_take_model_equals_path() -> None:
    assert parse_weights(["resnet50=/ckpt/r50.pt"]) == {"resnet50": "/ckpt/r50.pt"}
    with pytest.raises(argparse.ArgumentTypeError, match="MODEL=PATH"):
        parse_weights(["resnet50"])


def test_history_of_an_empty_folder_prints_an_empty_table(tmp_path, capsys) -> None:
    assert main(["history", "--records-dir", str(tmp_path)]) == 0
    assert "Promotion history" in capsys.readouterr().out


def _inferctl(*args: str) -> subprocess.CompletedProcess[str]:
    # A real subprocess: stdout and stderr are pipes, as in a CI log.
    return subprocess.run(
        [sys.executable, "-m", "inferctl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80", CACHE_ENV: os.environ[CACHE_ENV]},
    )


def test_version_names_the_package_and_the_triton_it_ships() -> None:
    done = _inferctl("--version")
    assert (
        done.returncode == 0
        and done.stdout.startswith("inferctl ")
        and "nvidia-pytriton" in done.stdout
    )


def test_output_in_a_log_is_full_width_columns_with_progress_lines(tmp_path) -> None:
    repository = tmp_path / "a-repository-path-long-enough-to-matter" / "model_repository"
    # Without the cache: another test of this session may have built the same entry, and a restored
    # one reads "up to date"; this test is about the columns of a real build.
    done = _inferctl(
        "build", "image_postprocess", "--repository", str(repository), "--no-build-cache"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    assert header.split() == [
        "model",
        "version",
        "precision",
        "status",
        "weights",
        "max",
        "abs",
        "err",
        "min",
        "cosine",
        "top-1",
        "agree",
    ]
    row = next(line for line in lines if line.startswith("image_postprocess "))
    assert row.split()[:4] == ["image_postprocess", "1", "n/a", "built"]
    assert not any(ch in done.stdout for ch in "┃│━…\x1b"), (
        "no box drawing, ellipsis or colour codes in a log"
    )
    assert "[0/1] building" in done.stderr, (
        "progress is a log line where no terminal can show a bar"
    )

    again = _inferctl("build", "image_postprocess", "--repository", str(repository), "--json")
    assert again.returncode == 0, again.stderr
    reports = _results(again.stdout, "build")
    assert [(r["model"], r["version"], r["skipped"]) for r in reports] == [
        ("image_postprocess", 1, True)
    ]
    assert all(len(line) <= MAX_LINE_CHARS for line in (done.stdout + done.stderr).splitlines())


def _results(stdout: str, command: str) -> list[dict[str, object]]:
    """The records of a ``--json`` answer, after checking it has the one shape every command's has."""
    document = json.loads(stdout)
    assert document["schema"] == JSON_SCHEMA and document["command"] == command, document
    assert isinstance(document["results"], list) and all(
        isinstance(r, dict) for r in document["results"]
    )
    return document["results"]


def test_history_json_is_the_common_document(tmp_path) -> None:
    done = _inferctl("history", "--records-dir", str(tmp_path), "--json")
    assert done.returncode == 0 and _results(done.stdout, "history") == []


def test_every_command_that_prints_results_takes_json() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("build", "up", "promote", "history"):
        options = {o for action in commands[name]._actions for o in action.option_strings}
        assert "--json" in options, name
        assert JSON_SCHEMA in commands[name].format_help(), f"{name} --help names the schema"


def test_up_json_names_its_endpoints_in_the_common_document(tmp_path) -> None:
    from inferctl.up_cmd import _endpoints

    args = build_parser().parse_args(
        ["up", "--state-dir", str(tmp_path), "--gateway-port", "18080", "--json"]
    )
    document = json_document("up", _endpoints(args, "127.0.0.1:8000"), api_key="gk_x", models=["m"])
    results = _results(document, "up")
    assert [r["service"] for r in results] == ["triton", "gateway"]
    assert results[1]["url"] == "http://127.0.0.1:18080" and results[1]["secrets_file"].endswith(
        "secrets.env"
    )
    assert json.loads(document)["api_key"] == "gk_x"


def test_plain_tables_never_cut_a_cell() -> None:
    table = Table("t", ("name", "value"))
    table.add_row("x" * 150, "9.06e-05")
    text = table.plain()
    assert "x" * 150 + "  9.06e-05" in text and table.as_records() == [
        {"name": "x" * 150, "value": "9.06e-05"}
    ]


def test_a_log_never_gets_a_line_over_the_cap(capsys) -> None:
    # A cell as long as a pasted config and a table wider than any log viewer: folded, nothing lost.
    table = Table("wide", ("model", "reason", "n"))
    table.add_row(
        "efficientnet_lite0_trt_int8", "engine " + "x" * 2000 + " needs TensorRT 10.5", "1"
    )
    table.add_row("m", " ".join(f"word{i}" for i in range(600)), "2")
    console = make_console()  # pytest's captured stdout is no terminal
    assert not console.is_terminal
    print_table(table, console)
    heading(
        console, "[green]platform is up"
    )  # was a rule as wide as the console: 100,000 characters
    console.print("y " * 3000)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= MAX_LINE_CHARS, max(len(line) for line in lines)
    assert "== platform is up ==" in lines and not any(set(line) == {"─"} for line in lines)
    assert out.count("x") == 2000 and "TensorRT" in out and "10.5" in out, (
        "the long cell is folded, not cut"
    )
    assert all(f"word{i}" in out for i in range(600))


def test_the_load_test_up_suggests_fits_the_tier_it_names() -> None:
    # No timing: the example's mean offered rate (users / mean think time, split by the users' weights)
    # against the tier's limits. The first key's tier (standard) is the one that shed 47% of it.
    import ast
    import re as regex

    from gateway.tenancy.tiers import DEFAULT_TIER_LIMITS
    from inferctl.up_cmd import LOAD_TEST_ARGS, LOAD_TEST_TIER
    from loadtest.scenarios import SCENARIOS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"--tier {LOAD_TEST_TIER}" in readme and " ".join(LOAD_TEST_ARGS.split()[:2]) in readme
    users = int(regex.search(r"--users (\d+)", LOAD_TEST_ARGS).group(1))  # type: ignore[union-attr]
    names = regex.search(r"--scenarios (\S+)", LOAD_TEST_ARGS).group(1).split(",")  # type: ignore[union-attr]
    source = ast.parse(
        (Path(__file__).resolve().parents[2] / "loadtest" / "locustfile.py").read_text()
    )
    weights = {
        node.name: next(
            (
                int(s.value.value)
                for s in node.body
                if isinstance(s, ast.Assign)
                and isinstance(s.value, ast.Constant)
                and getattr(s.targets[0], "id", "") == "weight"
            ),
            1,
        )
        for node in source.body
        if isinstance(node, ast.ClassDef)
    }
    total = sum(weights[SCENARIOS[n]] for n in names)
    per_minute_per_user = 60 / (
        (0.1 + 1.0) / 2
    )  # locustfile's default think time, 0.1-1.0 s, no latency
    per_model = {n: users * weights[SCENARIOS[n]] / total * per_minute_per_user for n in names}
    for tier, fits in ((LOAD_TEST_TIER, True), ("standard", False)):
        limit = DEFAULT_TIER_LIMITS[tier]
        assert limit.per_minute is not None and limit.key_per_minute is not None
        ok = (
            max(per_model.values()) <= limit.per_minute
            and sum(per_model.values()) <= limit.key_per_minute
        )
        assert ok is fits, (tier, per_model)
