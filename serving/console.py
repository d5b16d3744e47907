"""Command-line output that reads well on a terminal and in a CI log alike.

On a terminal, rich as usual: boxed tables, a live progress bar. Anywhere else (a pipe, a file, a CI
log) rich would cut every table to 80 columns and draw no progress at all, so there:

- tables are plain, aligned columns at their full width (:func:`print_table`), greppable and never
  truncated;
- progress is one log line per step with the elapsed time (:func:`progress`), instead of a bar
  that only a terminal can redraw.

Tables are data first (:class:`Table`), so a command can print the same rows as JSON
(:func:`Table.as_records`) for ``--json``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

__all__ = ["LogProgress", "Table", "make_console", "print_table", "progress"]


def make_console(*, stderr: bool = False) -> Console:
    """A console that wraps nothing when it is not a terminal (a log keeps whole lines)."""
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return probe
    return Console(stderr=stderr, soft_wrap=True, width=100_000, color_system=None)


@dataclass
class Table:
    """Rows of strings under named columns.

    Attributes:
        title: printed above the rows.
        columns: column names (also the keys of :meth:`as_records`).
        rows: one tuple of cell strings per row, as many cells as columns.
        caption: printed below the rows (settings, units).
    """

    title: str
    columns: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    caption: str = ""

    def add_row(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(tuple(str(c) for c in cells))

    def as_records(self) -> list[dict[str, str]]:
        """One ``{column: cell}`` dict per row."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def plain(self) -> str:
        """The table as aligned plain-text columns, every cell whole."""
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

        lines = [self.title] if self.title else []
        lines += [line(self.columns), line(["-" * w for w in widths])]
        lines += [line(row) for row in self.rows]
        if self.caption:
            lines.append(self.caption)
        return "\n".join(lines)

    def rich(self) -> RichTable:
        table = RichTable(title=self.title or None, caption=self.caption or None)
        for column in self.columns:
            table.add_column(column, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table


def print_table(table: Table, console: Console | None = None) -> None:
    """A rich table on a terminal, plain full-width columns anywhere else."""
    console = console or make_console()
    if console.is_terminal:
        console.print(table.rich())
    else:
        console.print(table.plain(), markup=False, highlight=False, soft_wrap=True)


class LogProgress:
    """The part of :class:`rich.progress.Progress` the commands use, as log lines.

    Each description change prints ``[done/total] description (elapsed)``, so a CI log shows what a
    long build is doing and for how long, where a progress bar would show nothing.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._tasks: dict[int, dict[str, Any]] = {}
        self._started = time.monotonic()

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> TaskID:
        task = TaskID(len(self._tasks))
        self._tasks[task] = {"description": description, "total": total, "completed": 0}
        self._log(task)
        return task

    def update(self, task: TaskID, *, description: str | None = None, advance: float | None = None,
               **_: Any) -> None:
        state = self._tasks[task]
        if advance:
            state["completed"] += advance
        if description is not None and description != state["description"]:
            state["description"] = description
            self._log(task)

    def advance(self, task: TaskID, advance: float = 1) -> None:
        self._tasks[task]["completed"] += advance

    def _log(self, task: TaskID) -> None:
        state = self._tasks[task]
        count = f"[{state['completed']:g}/{state['total']:g}] " if state["total"] else ""
        elapsed = time.monotonic() - self._started
        self.console.print(f"{count}{state['description']} ({elapsed:.1f}s)", markup=False, highlight=False)


@contextmanager
def progress(console: Console, *, transient: bool = True) -> Iterator[Progress | LogProgress]:
    """A live progress bar on a terminal, :class:`LogProgress` lines anywhere else."""
    if not console.is_terminal:
        yield LogProgress(console)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=transient) as bar:
        yield bar
