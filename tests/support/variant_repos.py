"""Helpers for the tests that write to a repository: private copies of built entries, and a tree hash."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable
from pathlib import Path

EFFICIENTNET_ENTRIES = ("efficientnet_lite0", "efficientnet_lite0_fp16", "efficientnet_lite0_int8")


def copy_entries(source: Path, target: Path, names: Iterable[str] = EFFICIENTNET_ENTRIES) -> Path:
    """Copy built entries of the shared test repository into a private one (tests may write there)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(source / name, target / name)
    return target


def tree_hash(root: Path) -> str:
    """sha256 over every path, file mode and byte under ``root``: equal hashes mean an untouched tree."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(str(path.stat().st_mode).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()
