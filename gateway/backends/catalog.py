"""Which model names exist: the gate every request passes before any per-model state is made.

Every distinct model name a client can put in a path becomes a rate-limit bucket, an in-flight
counter, a metric label and a statistics window once it is admitted, so names are checked first:

1. the spelling (:func:`model_name_problem`): what a Triton repository directory can be called and a
   URL path segment can carry, and none of the words Triton's HTTP API reserves after
   ``/v2/models/`` (``/v2/models/stats`` is Triton's statistics endpoint, not a model);
2. membership of the known set: Triton's repository index, cached for ``ttl_s``. A name not in the
   cache re-reads the index at most once per ``min_refresh_s``, so a flood of made-up names costs
   no Triton calls beyond that, and a freshly loaded model is found within it.

Aliases (public name -> Triton model) are resolved before the lookup; both sides are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from gateway.backends.triton import InferenceBackend
from gateway.errors import BadRequest, GatewayError, ModelNotFound
from serving.readiness import parse_model_list

__all__ = [
    "MODEL_NAME_PATTERN",
    "RESERVED_MODEL_NAMES",
    "ModelCatalog",
    "ModelNameList",
    "check_model_name",
    "check_model_names",
    "model_name_problem",
]

log = logging.getLogger(__name__)

#: letters, digits, ``_``, ``-`` and ``.``, not starting with ``.`` or ``-``: a directory name on any
#: file system, one URL path segment, and a bounded metric label
MODEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
#: words Triton's HTTP API routes itself after ``/v2/models/`` (or ``/v2/models/<name>/``)
RESERVED_MODEL_NAMES = frozenset(
    {
        "stats",
        "ready",
        "config",
        "infer",
        "versions",
        "trace",
        "generate",
        "generate_stream",
        "load",
        "unload",
        "index",
    }
)


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model name (``None`` when it can)."""
    if not MODEL_NAME_PATTERN.fullmatch(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        return (
            f"{shown!r} is not a model name: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter, digit or '_'"
        )
    if name in RESERVED_MODEL_NAMES:
        return f"'{name}' is reserved by Triton's HTTP API and cannot name a model"
    return None


def check_model_names(names: Iterable[str]) -> None:
    """:class:`ValueError` (a settings validator's error) for the first of ``names`` that cannot be
    a model name."""
    for name in names:
        problem = model_name_problem(name)
        if problem:
            raise ValueError(problem)


def _split_model_list(value: object) -> object:
    # The environment gives "a,b" (what a ConfigMap shared with Triton's probe holds) or a JSON list.
    return tuple(parse_model_list(value)) if isinstance(value, str) else value


def _unique_model_names(value: tuple[str, ...]) -> tuple[str, ...]:
    check_model_names(value)
    return tuple(dict.fromkeys(value))


#: a settings field of model names: a list, or "a,b" in the environment (with ``NoDecode`` beside it);
#: each checked as a model name, repeats dropped
ModelNameList = Annotated[
    tuple[str, ...], BeforeValidator(_split_model_list), AfterValidator(_unique_model_names)
]


def check_model_name(name: str, field: str = "model") -> str:
    """``name`` itself, or :class:`BadRequest` naming ``field`` when it cannot be a model name."""
    problem = model_name_problem(name)
    if problem is not None:
        raise BadRequest(problem, field=field)
    return name


class ModelCatalog:
    """The known model names, from Triton's repository index (cached), plus configured aliases.

    Args:
        backend: where the index comes from.
        aliases: public name -> Triton model.
        ttl_s: how long an index read is trusted for names it holds.
        min_refresh_s: the shortest interval between index reads caused by unknown names.
        timeout_s: the deadline of one index read.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        backend: InferenceBackend,
        *,
        aliases: Mapping[str, str] | None = None,
        ttl_s: float = 5.0,
        min_refresh_s: float = 1.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._aliases = dict(aliases or {})
        for public, target in self._aliases.items():
            check_model_name(public, "model_aliases")
            check_model_name(target, "model_aliases")
        self._ttl_s = ttl_s
        self._min_refresh_s = min_refresh_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._known: frozenset[str] = frozenset()
        self._index: list[dict[str, Any]] = []
        self._read_at: float | None = None
        self._lock = asyncio.Lock()
        self._renewal: asyncio.Task[None] | None = None
        #: index reads so far (tests count them)
        self.reads = 0

    def alias(self, name: str) -> str:
        """The Triton model behind a public name (no lookup, no check)."""
        return self._aliases.get(name, name)

    async def resolve(self, name: str, field: str = "model") -> str:
        """The Triton model a request names, checked to exist.

        Args:
            name: the name the client sent (a Triton model or an alias).
            field: the request field that carried it, for the error.

        Returns:
            The Triton model name.

        Raises:
            BadRequest: ``name`` cannot be a model name (reserved or malformed).
            ModelNotFound: Triton's repository has no such model.
            UpstreamUnavailable, UpstreamTimeout: the index could not be read and none is cached.
        """
        model = self.alias(check_model_name(name, field))
        if model in await self.known(model):
            return model
        raise ModelNotFound(name)

    async def known(self, wanted: str | None = None) -> frozenset[str]:
        """The known Triton model names.

        A stale set is still answered from at once while one background read renews it, so a
        request for a known model never waits for Triton's index; only the first read, and a
        name the set lacks (at most once per ``min_refresh_s``), wait for a read.
        """
        now = self._clock()
        if self._read_at is None:
            await self._refresh(stale_after=self._ttl_s)
        elif (
            wanted is not None
            and wanted not in self._known
            and now - self._read_at >= self._min_refresh_s
        ):
            await self._refresh(stale_after=self._min_refresh_s)
        elif now - self._read_at >= self._ttl_s and (self._renewal is None or self._renewal.done()):
            self._renewal = asyncio.create_task(self._refresh(stale_after=self._ttl_s))
        return self._known

    async def index(self) -> list[dict[str, Any]]:
        """Triton's repository index as last read (refreshed when stale)."""
        await self.known()
        return list(self._index)

    async def close(self) -> None:
        """Stop a background read, if one is running."""
        if self._renewal is not None and not self._renewal.done():
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal

    async def _refresh(self, stale_after: float) -> None:
        async with self._lock:
            # Another request may have refreshed while this one waited for the lock.
            if self._read_at is not None and self._clock() - self._read_at < stale_after:
                return
            try:
                index = await self._backend.repository_index(timeout_s=self._timeout_s)
            except GatewayError:
                if self._read_at is None:
                    raise
                # Keep serving the names we knew; try again after min_refresh_s, not on every request.
                log.warning(
                    "model index refresh failed; keeping the %d names read before", len(self._known)
                )
                self._read_at = self._clock() - self._ttl_s + self._min_refresh_s
                return
            self.reads += 1
            self._index = index
            self._known = frozenset(str(m["name"]) for m in index if "name" in m)
            self._read_at = self._clock()
