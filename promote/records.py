"""Promotion records: one JSON file per attempt, and the ``history`` listing.

A record is written when the attempt starts (decision ``pending``) and again after every step, so a
promoter that dies half-way still leaves the steps it took; the next promotion of the model reads it
to finish the rollback (see :mod:`promote.rollout`).

Decisions:

- ``promoted``: version N+1 serves all traffic (``reason`` lists clean-up steps that failed, if any);
- ``refused``: a gate failed, nothing was published;
- ``gates-passed``: the gates passed and publishing was not asked for;
- ``rolled-back``: N+1 failed after publishing and every rollback step ran;
- ``rollback-incomplete``: a rollback step could not run; the failed steps say which;
- ``pending``: the attempt is running, or its promoter died.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from serving.console import Table, print_table

__all__ = ["PromotionRecord", "history", "history_table", "print_history"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class PromotionRecord:
    model: str
    candidate: str  # the candidate repository
    candidate_sha256: str  # of the candidate artifact
    production_version: int | None
    new_version: int | None = None
    decision: str = "pending"  # see the module docstring
    reason: str = ""
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    started_at: str = field(default_factory=_now)
    finished_at: str = ""

    def step(self, name: str, **details: Any) -> dict[str, Any]:
        """Append a step (``ok: False`` plus ``error`` where it failed) and return it."""
        entry = {"step": name, "at": _now(), **details}
        self.steps.append(entry)
        return entry

    @property
    def failed_steps(self) -> list[dict[str, Any]]:
        return [s for s in self.steps if s.get("ok") is False]

    def finish(self, decision: str, reason: str = "") -> None:
        self.decision, self.reason, self.finished_at = decision, reason, _now()

    @property
    def gates_passed(self) -> bool:
        return bool(self.gates) and all(g.get("passed") for g in self.gates.values())

    def path(self, records_dir: Path) -> Path:
        stamp = self.started_at.replace(":", "").replace("-", "").replace(".", "")
        return records_dir / f"{self.model}-{stamp}-{self.candidate_sha256[:12]}.json"

    def write(self, records_dir: Path) -> Path:
        records_dir.mkdir(parents=True, exist_ok=True)
        path = self.path(records_dir)
        # Written whole, then renamed: a reader never sees half a record.
        staging = path.with_suffix(".json.tmp")
        staging.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        os.replace(staging, path)
        return path


def history(records_dir: Path, model: str | None = None) -> list[PromotionRecord]:
    """Every record, oldest first, optionally for one model."""
    if not records_dir.exists():
        return []
    records = [
        PromotionRecord(**json.loads(p.read_text(encoding="utf-8")))
        for p in sorted(records_dir.glob("*.json"))
    ]
    records = [r for r in records if model is None or r.model == model]
    return sorted(records, key=lambda r: r.started_at)


def history_table(records: list[PromotionRecord]) -> Table:
    """One row per promotion attempt: versions, decision, each gate's result and the reason."""
    table = Table(
        "Promotion history", ("started", "model", "from", "to", "decision", "gates", "reason")
    )
    for r in records:
        gates = " ".join(
            f"{name}:{'ok' if g.get('passed') else 'FAIL'}" for name, g in r.gates.items()
        )
        table.add_row(
            r.started_at,
            r.model,
            str(r.production_version or "-"),
            str(r.new_version or "-"),
            r.decision,
            gates,
            r.reason,
        )
    return table


def print_history(records: list[PromotionRecord], console: Console | None = None) -> None:
    print_table(history_table(records), console)
