"""Which models may stay in memory: the residency table and its least-recently-used choice.

Pure bookkeeping, no I/O and no clock of its own (the manager, :mod:`gateway.backends.residency`, passes
``time.monotonic()`` readings), so every rule below is unit-testable:

- A model's *charge* against the budget is its measured footprint once it has been loaded here
  (memory before and after its load), else an estimate: its size on disk x 1.25, as KServe ModelMesh
  sizes a model it has not seen, or the configured default when the repository's files cannot be
  read. A step an ensemble's load brought in is charged nothing: its memory is in the ensemble's
  measured footprint.
- A model that is loading or unloading is charged too: the memory is taken until Triton says the
  model is gone.
- Victims are chosen least recently used first among models that are LOADED, not pinned, have no
  request in flight and are not a step another resident ensemble holds; an ensemble's steps that
  would go with it must have nothing in flight either. If evicting every such model still would not
  make room, nothing is chosen (nothing is evicted for nothing).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DISK_FACTOR",
    "Entry",
    "ModelResidency",
    "ResidencyConfig",
    "ResidencyTable",
    "State",
    "disk_estimate",
]

#: ModelMesh's sizing of a model it has not measured: its size on disk times this
DISK_FACTOR = 1.25


@dataclass(frozen=True)
class ResidencyConfig:
    """How the manager behaves (from the gateway settings).

    Attributes:
        budget_bytes: memory the models of this Triton instance may take together.
        pinned: models never evicted.
        pin_loaded_at_start: pin what Triton had loaded when the gateway started (the default set).
        repository: the model repository, for disk-size estimates (``None``: not readable here).
        default_estimate_bytes: the charge of an unmeasured model whose files cannot be read.
        footprints_path: the JSON file measured footprints are kept in (``None``: not kept).
        max_pending_loads: loads queued at most; more cold requests are refused (429).
        max_concurrent_loads: Triton loads in progress at once (each decided only after the last
            one's room was made and its charge counted).
        failure_backoff_s: the first wait after a failed load (doubles per failure, at most 300 s).
        drain_timeout_s: how long a load waits for requests in flight on the models it must evict.
    """

    budget_bytes: int
    pinned: tuple[str, ...] = ()
    pin_loaded_at_start: bool = True
    repository: Path | None = None
    default_estimate_bytes: int = 512 * 1024 * 1024
    footprints_path: Path | None = None
    max_pending_loads: int = 16
    max_concurrent_loads: int = 1
    failure_backoff_s: float = 5.0
    drain_timeout_s: float = 5.0


@dataclass(frozen=True)
class ModelResidency:
    """One model's residency as the API shows it."""

    model: str
    state: str
    footprint_bytes: int
    measured: bool
    pinned: bool
    in_flight: int


class State(enum.StrEnum):
    """Where a model stands; ``available`` means in the repository, loadable on demand."""

    AVAILABLE = "available"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"


@dataclass
class Entry:
    """One model's residency.

    Attributes:
        name: the Triton model.
        state: see :class:`State`.
        estimate_bytes: what it is charged until measured.
        footprint_bytes: the measured footprint (``None`` until a load here measured it).
        last_used: monotonic time of its last request (or load).
        in_flight: requests holding it now.
        waiters: requests waiting for its load (it is not evicted before they have started).
        pinned: never evicted.
        steps: the models an ensemble runs (empty for other models).
        held_by: resident ensembles whose steps include this model.
        carried: loaded only because an ensemble was (unloaded with its last holder).
        draining: chosen to make room once its requests in flight finish; new requests wait for
            its reload instead of starting on it.
        failures: consecutive failed loads.
        retry_at: monotonic time before which a failed model is not tried again.
    """

    name: str
    state: State = State.AVAILABLE
    estimate_bytes: int = 0
    footprint_bytes: int | None = None
    last_used: float = 0.0
    in_flight: int = 0
    waiters: int = 0
    pinned: bool = False
    steps: tuple[str, ...] = ()
    held_by: set[str] = field(default_factory=set)
    carried: bool = False
    draining: bool = False
    failures: int = 0
    retry_at: float = 0.0

    @property
    def usable(self) -> bool:
        """Whether a request may start on it now."""
        return self.state is State.LOADED and not self.draining

    @property
    def measured(self) -> bool:
        return self.footprint_bytes is not None

    @property
    def size_bytes(self) -> int:
        """Its footprint if measured, else its estimate."""
        return self.footprint_bytes if self.footprint_bytes is not None else self.estimate_bytes

    @property
    def charge_bytes(self) -> int:
        """What it takes from the budget now (0 when not resident, or carried by an ensemble)."""
        if self.state is State.AVAILABLE or self.carried:
            return 0
        return self.size_bytes


def disk_estimate(folder: Path) -> int | None:
    """``DISK_FACTOR`` x the bytes under a repository entry, or ``None`` when it cannot be read."""
    try:
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    except OSError:
        return None
    return int(total * DISK_FACTOR) if total else None


class ResidencyTable:
    """Every known model's :class:`Entry` and the budget they share.

    Args:
        budget_bytes: memory the models of one Triton instance may take together.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.entries: dict[str, Entry] = {}

    def get(self, name: str, estimate_bytes: int) -> Entry:
        """The entry of ``name``, made (available, charged ``estimate_bytes``) on first sight."""
        entry = self.entries.get(name)
        if entry is None:
            entry = self.entries[name] = Entry(name, estimate_bytes=estimate_bytes)
        return entry

    def used_bytes(self) -> int:
        """What resident models are charged together."""
        return sum(e.charge_bytes for e in self.entries.values())

    def fits_alone(self, entry: Entry) -> bool:
        """Whether ``entry`` could fit at all (with every other unpinned model evicted)."""
        pinned = sum(
            e.charge_bytes for e in self.entries.values() if e.pinned and e.name != entry.name
        )
        return entry.size_bytes + pinned <= self.budget_bytes

    def going_with(self, entry: Entry) -> list[Entry]:
        """The steps that leave with ensemble ``entry``: carried, and held by no other ensemble."""
        out = []
        for name in entry.steps:
            step = self.entries.get(name)
            if step is not None and step.carried and step.held_by <= {entry.name}:
                out.append(step)
        return out

    def evictable(self, entry: Entry, protect: str = "", *, when_idle: bool = False) -> bool:
        """Whether ``entry`` may be evicted now (see the module docstring); ``when_idle``: once its
        requests in flight (and its steps') have finished."""
        if (
            entry.name == protect
            or entry.state is not State.LOADED
            or entry.pinned
            or entry.held_by
            or entry.draining  # claimed by another load already: going, and not twice
        ):
            return False
        if (entry.in_flight or entry.waiters) and not when_idle:
            return False
        return all(
            (when_idle or step.in_flight == 0) and not step.pinned
            for step in self.going_with(entry)
        )

    def victims(
        self,
        need_bytes: int,
        protect: str = "",
        exclude: Iterable[str] = (),
        *,
        when_idle: bool = False,
    ) -> list[Entry] | None:
        """Least recently used models to evict so that ``need_bytes`` more fit in the budget.

        Args:
            need_bytes: the charge about to be added.
            protect: a model never chosen (the one being loaded).
            exclude: more models never chosen.
            when_idle: count models with requests in flight as evictable (would room be made once
                they finish?).

        Returns:
            The victims, oldest first (empty when it already fits), or ``None`` when even evicting
            every evictable model would not make room: then nothing should be evicted.
        """
        skip = set(exclude)
        free = self.budget_bytes - self.used_bytes()
        if free >= need_bytes:
            return []
        chosen: list[Entry] = []
        candidates = sorted(
            (
                e
                for e in self.entries.values()
                if e.name not in skip and self.evictable(e, protect, when_idle=when_idle)
            ),
            key=lambda e: e.last_used,
        )
        for entry in candidates:
            chosen.append(entry)
            free += entry.charge_bytes + sum(s.charge_bytes for s in self.going_with(entry))
            if free >= need_bytes:
                return chosen
        return None

    def snapshot(self) -> Mapping[str, Entry]:
        """The entries by name (read-only use)."""
        return dict(self.entries)
