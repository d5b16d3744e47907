"""Promotion records: one JSON file per attempt, and the ``history`` listing."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["PromotionRecord", "history", "print_history"]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class PromotionRecord:
    model: str
    candidate: str  # the candidate repository
    candidate_sha256: str  # of the candidate artifact
    production_version: int | None
    new_version: int | None = None
    decision: str = "pending"  # promoted | refused | rolled-back | gates-passed | pending
    reason: str = ""
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    started_at: str = field(default_factory=_now)
    finished_at: str = ""

    def step(self, name: str, **details: Any) -> None:
        self.steps.append({"step": name, "at": _now(), **details})

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
        path.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        return path


def history(records_dir: Path, model: str | None = None) -> list[PromotionRecord]:
    """Every record, oldest first, optionally for one model."""
    if not records_dir.exists():
        return []
    records = [PromotionRecord(**json.loads(p.read_text(encoding="utf-8"))) for p in sorted(records_dir.glob("*.json"))]
    records = [r for r in records if model is None or r.model == model]
    return sorted(records, key=lambda r: r.started_at)


def print_history(records: list[PromotionRecord], console: Console | None = None) -> None:
    table = Table(title="Promotion history")
    for column in ("started", "model", "from", "to", "decision", "gates", "reason"):
        table.add_column(column)
    for r in records:
        gates = " ".join(f"{name}:{'ok' if g.get('passed') else 'FAIL'}" for name, g in r.gates.items())
        table.add_row(r.started_at, r.model, str(r.production_version or "-"), str(r.new_version or "-"),
                      r.decision, gates, r.reason[:80])
    (console or Console()).print(table)
