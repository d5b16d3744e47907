"""Fixtures of the promotion tests: candidate builds, made once per session and shared by the modules."""

from __future__ import annotations

import pytest

from tests.support.promotion import CandidateBuilds


@pytest.fixture(scope="session")
def candidate_builds(tmp_path_factory: pytest.TempPathFactory) -> CandidateBuilds:
    """``candidate_builds(SpecClass)`` -> a candidate repository holding that spec's real build."""
    return CandidateBuilds(tmp_path_factory.mktemp("candidates"))
