"""A circuit breaker per model: what the gateway answers while a broken model is being healed.

::

    closed ──(a dead worker process, or ``failures`` internal errors in a row)──> open
    open   ──(the healer reloaded the failing model and a synthetic inference passed)──> closed

While a model's breaker is open its requests are answered at once with
:class:`gateway.errors.ModelUnhealthy` (503 + Retry-After): never a hang on a model that cannot answer,
never a 502 per request. Only outcomes that say the model is broken count: a client's bad input, a
full queue or a deadline are not the model's failure. No I/O here; :mod:`gateway.backends.model_healer` owns
the breakers and does the healing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import GatewayError, ModelUnhealthy, UpstreamError

__all__ = ["DEFAULT_BREAKER_FAILURES", "Breakers", "Trip"]

#: internal errors (502) in a row that open a model's breaker; a dead worker process opens it at once
DEFAULT_BREAKER_FAILURES = 3


@dataclass(frozen=True)
class Trip:
    """A breaker that just opened.

    Attributes:
        model: the model whose requests are refused meanwhile (the one the clients call).
        target: the model to reload (``model`` itself, or the pipeline step whose worker died).
        reason: what opened it, for the log.
    """

    model: str
    target: str
    reason: str


@dataclass
class _State:
    failures: int = 0
    open_since: float | None = None
    retry_at: float = 0.0


@dataclass
class Breakers:
    """The breakers of every model that has failed at least once.

    Args:
        failures: internal errors in a row that open a breaker.
        clock: monotonic seconds (tests pass their own).
    """

    failures: int = DEFAULT_BREAKER_FAILURES
    clock: Callable[[], float] = time.monotonic
    _states: dict[str, _State] = field(default_factory=dict)

    def is_open(self, model: str) -> bool:
        state = self._states.get(model)
        return state is not None and state.open_since is not None

    def open_models(self) -> list[str]:
        return sorted(m for m, s in self._states.items() if s.open_since is not None)

    def check(self, model: str) -> None:
        """Refuse a request for ``model`` while its breaker is open.

        Raises:
            ModelUnhealthy: the breaker is open; Retry-After is when the next reload attempt ends.
        """
        state = self._states.get(model)
        if state is None or state.open_since is None:
            return
        raise ModelUnhealthy(
            f"model '{model}' is being reloaded after a failure; retry shortly",
            failed_model=model,
            retry_after_s=max(1.0, state.retry_at - self.clock()),
        )

    def success(self, model: str) -> None:
        """A request for ``model`` was answered: its run of failures ends."""
        state = self._states.get(model)
        if state is not None and state.open_since is None:
            state.failures = 0

    def failure(self, model: str, exc: GatewayError) -> Trip | None:
        """Count a failed request for ``model``.

        Returns:
            The trip when this failure opened the breaker; ``None`` otherwise (not the model's
            fault, not enough failures yet, or already open).
        """
        if isinstance(exc, ModelUnhealthy):
            target, reason = exc.failed_model, f"a worker process of '{exc.failed_model}' died"
        elif isinstance(exc, UpstreamError):
            target, reason = model, f"{self.failures} internal errors in a row"
        else:
            return None
        state = self._states.setdefault(model, _State())
        if state.open_since is not None:
            return None
        state.failures += 1
        if not isinstance(exc, ModelUnhealthy) and state.failures < self.failures:
            return None
        state.open_since = self.clock()
        return Trip(model, target, reason)

    def retry_at(self, model: str, when: float) -> None:
        """When the healer expects its next attempt on ``model`` to have finished (for Retry-After)."""
        state = self._states.get(model)
        if state is not None:
            state.retry_at = when

    def close(self, model: str) -> float:
        """Close ``model``'s breaker.

        Returns:
            How long it was open, in seconds (0 when it was not).
        """
        state = self._states.pop(model, None)
        if state is None or state.open_since is None:
            return 0.0
        return self.clock() - state.open_since
