"""Command-line output that reads well on a terminal and in a CI log alike.

On a terminal, rich as usual: boxed tables that fit the terminal, a live progress bar. Anywhere else
(a pipe, a file, a CI log) rich would cut every table to 80 columns and draw no progress at all, so
there:

- tables are plain, aligned columns at their full width (:func:`print_table`), greppable and never
  truncated: a cell too long for :data:`MAX_LINE_CHARS` folds onto continuation lines of its column;
- progress is one log line per step with the elapsed time (:func:`progress`), instead of a bar
  that only a terminal can redraw;
- no line is longer than :data:`MAX_LINE_CHARS` (the console wraps longer text; a heading is a short
  line, not a rule across the whole width).

Tables are data first (:class:`Table`), so a command can print the same rows as JSON
(:func:`Table.as_records`) for ``--json``; :func:`json_document` is the one shape every ``--json``
answer has.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable
from rich.text import Text

__all__ = [
    "JSON_SCHEMA",
    "MAX_LINE_CHARS",
    "LogProgress",
    "Table",
    "heading",
    "json_document",
    "make_console",
    "number_cell",
    "print_table",
    "progress",
    "quiet_library_progress",
]

#: the longest line written where no terminal is (a log): long enough for a pasteable command, a
#: table row or a URL, short enough for any log viewer
MAX_LINE_CHARS = 320
#: names the shape of every ``--json`` answer (see :func:`json_document`)
JSON_SCHEMA = "inferctl/v1"


def make_console(*, stderr: bool = False) -> Console:
    """A terminal's own console; elsewhere one that keeps lines whole up to :data:`MAX_LINE_CHARS`.

    Off a terminal nothing is cut to 80 columns, but nothing is unbounded either: rich wraps text past
    :data:`MAX_LINE_CHARS`, and anything drawn across the full width (a rule) would otherwise be as
    wide as the console.
    """
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return probe
    return Console(stderr=stderr, width=MAX_LINE_CHARS, color_system=None)


def quiet_library_progress(console: Console) -> None:
    """Switch off the progress bars libraries draw themselves (tqdm, Hugging Face) off a terminal.

    In a log, tqdm's carriage returns leave one line holding every redraw of the bar (hundreds of
    thousands of characters over a long step); our own progress lines say the same. Call it before
    those libraries are imported: transformers reads the switch once, at import.
    """
    if not console.is_terminal:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")


def heading(console: Console, text: str) -> None:
    """A section heading: a rule across a terminal, one short ``== text ==`` line in a log."""
    if console.is_terminal:
        console.rule(text)
    else:
        console.print(f"== {Text.from_markup(text).plain} ==", markup=False, highlight=False)


def json_document(command: str, results: Sequence[Mapping[str, Any]], **extra: Any) -> str:
    """The one shape of every ``inferctl ... --json`` answer on stdout.

    ``{"schema": "inferctl/v1", "command": "<command>", "results": [{...}, ...], ...extra}``:
    ``results`` is always a list of objects (one per model built, record, endpoint...), even when there
    is one; ``extra`` holds the command's few top-level facts. Messages and progress go to stderr.

    Args:
        command: the subcommand (``build``, ``up``, ``promote``, ``history``).
        results: the records.
        extra: further top-level keys.

    Returns:
        Indented JSON text.
    """
    return json.dumps(
        {"schema": JSON_SCHEMA, "command": command, "results": list(results), **extra},
        indent=2,
        sort_keys=True,
        default=str,
    )


def number_cell(value: float | None, spec: str) -> str:
    """``value`` formatted by ``spec`` for a table cell; ``-`` where there is no figure (None or NaN)."""
    return "-" if value is None or math.isnan(value) else format(value, spec)


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

    def plain(self, max_width: int = MAX_LINE_CHARS) -> str:
        """The table as aligned plain-text columns, every cell whole.

        Args:
            max_width: the longest line; the widest columns are narrowed until a row fits, and a
                cell longer than its column continues on the next lines of that column.
        """
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        gaps = 2 * (len(widths) - 1)
        while sum(widths) + gaps > max_width and max(widths) > 12:
            widest = widths.index(max(widths))
            widths[widest] = max(12, widths[widest] - (sum(widths) + gaps - max_width))

        def lines(cells: Sequence[str]) -> list[str]:
            folded = [
                textwrap.wrap(cell, width, break_long_words=True, break_on_hyphens=False) or [""]
                if len(cell) > width
                else [cell]
                for cell, width in zip(cells, widths, strict=True)
            ]
            depth = max(len(parts) for parts in folded)
            return [
                "  ".join(
                    (parts[i] if i < len(parts) else "").ljust(width)
                    for parts, width in zip(folded, widths, strict=True)
                ).rstrip()
                for i in range(depth)
            ]

        out = [self.title] if self.title else []
        out += lines(self.columns) + lines(["-" * w for w in widths])
        for row in self.rows:
            out += lines(row)
        if self.caption:
            out += textwrap.wrap(self.caption, max_width) or [""]
        return "\n".join(out)

    def rich(self) -> RichTable:
        # expand=False and folding cells: the table is as wide as its content, at most the terminal.
        table = RichTable(title=self.title or None, caption=self.caption or None)
        for column in self.columns:
            table.add_column(column, overflow="fold")
        for row in self.rows:
            table.add_row(*row)
        return table


def print_table(table: Table, console: Console | None = None) -> None:
    """A rich table fitting the terminal, plain full-width columns (at most MAX_LINE_CHARS) elsewhere."""
    console = console or make_console()
    if console.is_terminal:
        console.print(table.rich())
    else:
        # soft_wrap: the plain text is already folded to the cap; rich must not re-wrap its columns.
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

    def update(
        self,
        task: TaskID,
        *,
        description: str | None = None,
        advance: float | None = None,
        **_: Any,
    ) -> None:
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
        self.console.print(
            f"{count}{state['description']} ({elapsed:.1f}s)", markup=False, highlight=False
        )


@contextmanager
def progress(console: Console, *, transient: bool = True) -> Iterator[Progress | LogProgress]:
    """A live progress bar on a terminal, :class:`LogProgress` lines anywhere else."""
    if not console.is_terminal:
        yield LogProgress(console)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=transient) as bar:
        yield bar
