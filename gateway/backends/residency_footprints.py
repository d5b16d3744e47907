"""Measured model footprints, kept in a JSON file so the next start charges what was measured.

A footprint is measured around a load (:mod:`gateway.backends.residency`); an unreadable file is
ignored with a warning (the estimates take over), and a failed write only costs the next start its
measurements.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

__all__ = ["FootprintBook"]

log = logging.getLogger(__name__)


class FootprintBook:
    """``{model: bytes}`` measured so far, read at start and written after each new measurement.

    Args:
        path: the JSON file (``None``: kept in memory only).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._bytes = self._read()

    def get(self, model: str) -> int | None:
        return self._bytes.get(model)

    def remember(self, model: str, footprint_bytes: int) -> None:
        self._bytes[model] = footprint_bytes
        if self.path is None:
            return
        try:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._bytes, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("residency: could not write footprints to %s: %s", self.path, exc)

    def _read(self) -> dict[str, int]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            return {str(k): int(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("residency: ignoring unreadable footprints file %s: %s", self.path, exc)
            return {}
