"""Carried packs on a GPU host (``loadtest.bench.carried``): finding a pack's file and unpacking one
where this process and its children import it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loadtest.bench.carried import one, unpack_onto_path


def test_one_takes_the_newest_match_and_names_the_command_that_makes_a_missing_pack(
    tmp_path: Path,
) -> None:
    for name in ("numpy-1.26.3-x.whl", "numpy-1.26.4-x.whl", "other-1.0.whl"):
        (tmp_path / name).write_bytes(b"")
    assert one(tmp_path, "numpy-1.*.whl").name == "numpy-1.26.4-x.whl"
    with pytest.raises(SystemExit, match="diffusers-\\*.zip is missing: run make-it"):
        one(tmp_path, "diffusers-*.zip", "make-it")


def test_an_unpacked_archive_imports_here_and_in_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "pack.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("carried_probe_pkg/__init__.py", "VALUE = 42\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    unpack_onto_path(archive, tmp_path / "site")
    import carried_probe_pkg  # type: ignore[import-not-found]

    assert carried_probe_pkg.VALUE == 42
    child = subprocess.run(
        [sys.executable, "-c", "import carried_probe_pkg; print(carried_probe_pkg.VALUE)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "42"
    sys.modules.pop("carried_probe_pkg")
