"""The ``inferctl`` command line: its commands and its answers to bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferctl.build_cmd import parse_weights
from inferctl.cli import build_parser, main


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
    return subprocess.run([sys.executable, "-m", "inferctl", *args], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2], env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"})


def test_version_names_the_package_and_the_triton_it_ships() -> None:
    done = _inferctl("--version")
    assert done.returncode == 0 and done.stdout.startswith("inferctl ") and "nvidia-pytriton" in done.stdout


def test_output_in_a_log_is_full_width_columns_with_progress_lines(tmp_path) -> None:
    repository = tmp_path / "a-repository-path-long-enough-to-matter" / "model_repository"
    done = _inferctl("build", "image_postprocess", "--repository", str(repository))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    assert header.split() == ["model", "version", "precision", "status", "weights", "max", "abs", "err", "min",
                              "cosine", "top-1", "agree"]
    row = next(line for line in lines if line.startswith("image_postprocess "))
    assert row.split()[:4] == ["image_postprocess", "1", "n/a", "built"]
    assert not any(ch in done.stdout for ch in "┃│━…\x1b"), "no box drawing, ellipsis or colour codes in a log"
    assert "[0/1] building" in done.stderr, "progress is a log line where no terminal can show a bar"

    again = _inferctl("build", "image_postprocess", "--repository", str(repository), "--json")
    assert again.returncode == 0, again.stderr
    reports = json.loads(again.stdout)
    assert [(r["model"], r["version"], r["skipped"]) for r in reports] == [("image_postprocess", 1, True)]


def test_history_json_is_a_list_of_records(tmp_path) -> None:
    done = _inferctl("history", "--records-dir", str(tmp_path), "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == []


def test_plain_tables_never_cut_a_cell() -> None:
    from serving.console import Table

    table = Table("t", ("name", "value"))
    table.add_row("x" * 150, "9.06e-05")
    text = table.plain()
    assert "x" * 150 + "  9.06e-05" in text and table.as_records() == [{"name": "x" * 150, "value": "9.06e-05"}]
