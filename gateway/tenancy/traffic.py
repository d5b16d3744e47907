"""Per-model version weights: how a canary gets a share of traffic.

With no weights set, requests name no version and Triton answers with the version its policy
serves. While a promotion runs, the promoter sets weights (``{1: 0.9, 2: 0.1}``) and each request is
pinned to one version, drawn by weight.

A weight can also name another Triton model, ``model:<name>``: that share of the requests goes to
it (with no version named). This is how a pipeline's traffic passes through a canary: Triton keeps
one configuration per model, so an ensemble whose step must call version N+1 is a second ensemble
(the promoter loads ``image_classifier__canary`` beside ``image_classifier``), and its weights are
``{"1": 0.9, "model:image_classifier__canary": 0.1}``. The admin sets these; clients cannot name a
target, and the target answers under its own name.

Outcomes: while a model's weights are set, every request they routed is counted per target, as
answered or failed (anything but a client error: the target's fault, a timeout, or the target not
being served). This is what a promotion watches during a canary: it is the only place that sees
each client request's outcome by version (Triton's Python-based backends report a request they
answered with an error as a success). With a store the counts add up across replicas and workers:
each process adds what it counted since its last check (:class:`gateway.tenancy.state_sync.StateSync`).

Where the weights live: in this process only (the single-process default), or in a shared
:class:`TrafficStore` (Redis, whenever one is configured). With a store, a change made through any
replica or worker is written there first and applied here; the others pick it up through
:class:`gateway.tenancy.state_sync.StateSync`, which reloads the table when its version counter moves. Every
request still draws its version from the in-memory copy: the hot path never waits on the store.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.backends.catalog import check_model_name, model_name_problem
from gateway.errors import BadRequest, StateStoreUnavailable
from gateway.tenancy.keys import in_store_thread

__all__ = [
    "MAX_VERSIONS",
    "MAX_WEIGHT",
    "MODEL_TARGET",
    "Counts",
    "Route",
    "TrafficSplit",
    "TrafficStore",
    "check_target",
    "check_version",
    "check_weights",
]

#: largest weight accepted: weights are relative, so this bounds nothing useful, only arithmetic
MAX_WEIGHT = 1_000_000.0
#: versions one model's traffic may be split across
MAX_VERSIONS = 16
#: prefix of a weight key that names another model instead of a version
MODEL_TARGET = "model:"
# Triton model versions are positive int64 numbers, written in ASCII digits.
_VERSION = re.compile(r"[1-9][0-9]{0,18}")

# the start of the 503 when the shared store is unreachable
_OUTAGE = "canary weights are unavailable"


Counts = dict[str, dict[str, list[int]]]
"""model -> target -> [answered, failed]"""


class TrafficStore(Protocol):
    """Where shared weights persist (blocking calls; raise :class:`KeyStoreUnavailable` on outage)."""

    def load(self) -> dict[str, dict[str, float]]: ...

    def save(self, model: str, weights: dict[str, float]) -> None: ...

    def delete(self, model: str) -> bool:
        """Unpin ``model`` and forget its outcome counts."""
        ...

    def add_outcomes(self, counts: Counts) -> None: ...

    def outcomes(self, model: str) -> dict[str, list[int]]: ...


def check_version(version: str, field: str = "version") -> str:
    """``version`` itself when it can be a Triton model version, else :class:`BadRequest` naming ``field``."""
    if not _VERSION.fullmatch(version) or int(version) >= 2**63:
        shown = version if len(version) <= 24 else version[:24] + "..."
        raise BadRequest(f"version {shown!r} is not a positive integer", field=field)
    return version


@dataclass(frozen=True)
class Route:
    """Where one request goes: a Triton model and version ('' lets Triton's version policy choose)."""

    model: str
    version: str = ""


def check_target(target: str, field: str = "versions") -> Route | str:
    """A weight key: a version of the model itself (returned as is) or ``model:<name>`` (a :class:`Route`).

    Raises:
        BadRequest: neither a version nor ``model:`` followed by a valid model name.
    """
    if target.startswith(MODEL_TARGET):
        return Route(check_model_name(target[len(MODEL_TARGET) :], field=field))
    return check_version(target, field=field)


def _route(model: str, target: str) -> Route:
    return (
        Route(target[len(MODEL_TARGET) :])
        if target.startswith(MODEL_TARGET)
        else Route(model, target)
    )


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """The targets with a positive weight, once every weight can route traffic.

    Raises:
        BadRequest: too many targets, a key that is neither a positive int64 in ASCII digits nor
            ``model:<name>``, a weight that is not a finite number in [0, ``MAX_WEIGHT``], or no
            positive weight.
    """
    if len(weights) > MAX_VERSIONS:
        raise BadRequest(f"{len(weights)} versions; at most {MAX_VERSIONS}", field="versions")
    for version, weight in weights.items():
        check_target(version, field="versions")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
        ):
            raise BadRequest(
                f"weight of version {version} is not a finite number", field=f"versions.{version}"
            )
        if not 0 <= weight <= MAX_WEIGHT:
            raise BadRequest(
                f"weight of version {version} is {weight:g}; weights go from 0 to {MAX_WEIGHT:g}",
                field=f"versions.{version}",
            )
    kept = {v: float(w) for v, w in weights.items() if w > 0}
    if not kept:
        raise BadRequest("at least one version needs a positive weight", field="versions")
    return kept


def _is_target(key: str) -> bool:
    if key.startswith(MODEL_TARGET):
        return model_name_problem(key[len(MODEL_TARGET) :]) is None
    return _VERSION.fullmatch(key) is not None


class TrafficSplit:
    """Version weights per model.

    Args:
        rng: the random source for draws (seeded in tests).
        store: the shared store; weights stay in this process when ``None``.
    """

    def __init__(self, rng: random.Random | None = None, store: TrafficStore | None = None) -> None:
        self._weights: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        self._rng = rng or random.Random()
        self.store = store
        # Outcomes counted here: the totals without a store, the part not yet added to it with one.
        self._counts: Counts = {}

    def set(self, model: str, weights: Mapping[str, float]) -> None:
        """Route ``model``'s traffic to versions by weight, in this process (weights need not sum to 1).

        Raises:
            BadRequest: as :func:`check_weights`.
        """
        kept = check_weights(weights)
        self._weights[model] = (tuple(kept), tuple(kept.values()))

    def clear(self, model: str) -> bool:
        """Back to unpinned routing in this process; ``False`` when nothing was set."""
        if self.store is None:
            self._counts.pop(model, None)
        return self._weights.pop(model, None) is not None

    def splits(self, model: str) -> bool:
        """Whether weights route ``model``'s traffic now (a canary or a pinned rollout is under way)."""
        return model in self._weights

    def observe(self, model: str, route: Route, ok: bool) -> None:
        """Count one routed request's outcome (nothing is counted for a model without weights)."""
        if model not in self._weights:
            return
        target = route.version if route.model == model else MODEL_TARGET + route.model
        self._counts.setdefault(model, {}).setdefault(target, [0, 0])[0 if ok else 1] += 1

    async def flush(self) -> None:
        """Add this process's counts to the store (no-op without one); kept for the next call if it fails.

        Raises:
            StateStoreUnavailable: the store cannot be reached.
        """
        if self.store is None or not self._counts:
            return
        counts, self._counts = self._counts, {}
        try:
            await in_store_thread(_OUTAGE, self.store.add_outcomes, counts)
        except StateStoreUnavailable:
            for model, targets in counts.items():
                for target, (answered, failed) in targets.items():
                    mine = self._counts.setdefault(model, {}).setdefault(target, [0, 0])
                    mine[0] += answered
                    mine[1] += failed
            raise

    async def outcomes(self, model: str) -> dict[str, dict[str, int]]:
        """Requests routed by ``model``'s weights since they were set, per target (every process's,
        with a store).

        Raises:
            StateStoreUnavailable: the store cannot be reached.
        """
        if self.store is not None:
            await self.flush()
            counts = await in_store_thread(_OUTAGE, self.store.outcomes, model)
        else:
            counts = self._counts.get(model, {})
        return {
            target: {"answered": answered, "failed": failed}
            for target, (answered, failed) in sorted(counts.items())
        }

    async def update(self, model: str, weights: Mapping[str, float]) -> None:
        """Set ``model``'s weights everywhere: in the shared store first (when there is one), then here.

        Raises:
            BadRequest: invalid weights (nothing is written).
            StateStoreUnavailable: the store cannot be reached (nothing changed here).
        """
        kept = check_weights(weights)
        if self.store is not None:
            await in_store_thread(_OUTAGE, self.store.save, model, kept)
        self.set(model, kept)

    async def remove(self, model: str) -> bool:
        """Unpin ``model`` everywhere; ``False`` when it was not pinned.

        Raises:
            StateStoreUnavailable: the store cannot be reached.
        """
        existed = False
        if self.store is not None:
            existed = bool(await in_store_thread(_OUTAGE, self.store.delete, model))
        return self.clear(model) or existed

    async def reload(self) -> None:
        """Replace this process's table by the store's (no-op without a store).

        Raises:
            StateStoreUnavailable: the store cannot be reached (the current table stays).
        """
        if self.store is None:
            return
        table = await in_store_thread(_OUTAGE, self.store.load)
        fresh: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {}
        for model, weights in table.items():
            kept = {
                v: w for v, w in weights.items() if _is_target(v) and math.isfinite(w) and w > 0
            }
            if kept:  # the store only ever holds validated weights; skip anything else
                fresh[model] = (tuple(kept), tuple(kept.values()))
        self._weights = fresh

    def route(self, model: str) -> Route:
        """Where one request for ``model`` goes: drawn by weight, or unpinned when none are set."""
        entry = self._weights.get(model)
        if entry is None:
            return Route(model)
        targets, weights = entry
        return _route(
            model, targets[0] if len(targets) == 1 else self._rng.choices(targets, weights)[0]
        )

    def pick(self, model: str) -> str:
        """The version for one request ('' = let Triton choose); see :meth:`route` for model targets."""
        return self.route(model).version

    def snapshot(self) -> dict[str, dict[str, float]]:
        total = {m: sum(w) for m, (_, w) in self._weights.items()}
        return {
            m: {v: w / total[m] for v, w in zip(vs, ws, strict=True)}
            for m, (vs, ws) in self._weights.items()
        }
