"""The ``inferctl`` command line: its commands and its answers to bad input."""

from __future__ import annotations

import argparse

import pytest

from inferctl.build_cmd import parse_weights
from inferctl.cli import build_parser, main


def test_every_command_is_registered() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {"build", "up", "promote", "history", "bench"}


def test_build_of_an_unknown_model_names_it_and_touches_nothing(tmp_path, capsys) -> None:
    repository = tmp_path / "repo"
    assert main(["build", "no_such_model", "--repository", str(repository)]) == 1
    assert "unknown model 'no_such_model'" in capsys.readouterr().out
    assert not repository.exists()


def test_weights_take_model_equals_path() -> None:
    assert parse_weights(["resnet50=/ckpt/r50.pt"]) == {"resnet50": "/ckpt/r50.pt"}
    with pytest.raises(argparse.ArgumentTypeError, match="MODEL=PATH"):
        parse_weights(["resnet50"])


def test_history_of_an_empty_folder_prints_an_empty_table(tmp_path, capsys) -> None:
    assert main(["history", "--records-dir", str(tmp_path)]) == 0
    assert "Promotion history" in capsys.readouterr().out
