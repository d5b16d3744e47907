"""Smoke of ``inferctl bench clients``: the four paths run against a real Triton and gateway and the table
reads right. Figures are printed by the command, never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.clients_bench import PATHS, ClientsSettings, run_benchmark, table
from tests.support.tiny_repo import TINY_MODEL, build_tiny_repository

pytestmark = pytest.mark.integration


def test_every_path_answers_and_the_table_quotes_the_direct_path(tmp_path: Path) -> None:
    repository = build_tiny_repository(tmp_path / "repository")
    figures = run_benchmark(repository, TINY_MODEL, ClientsSettings([2], duration_s=1.0, rounds=1))
    assert [f.path for f in figures] == [label for label, _, _ in PATHS]
    assert all(f.requests > 0 and f.errors == 0 for f in figures), figures
    rows = table(figures, TINY_MODEL, 1, 1.0, 1).as_records()
    assert [r["vs direct req/s"] == "-" for r in rows] == [True, False, True, False]
