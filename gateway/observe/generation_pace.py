"""How long an image generation will take, learned from the ones this process has run.

``/v1/images/generations`` answers a request whose estimate is past ``GATEWAY_IMAGE_ASYNC_AFTER_S``
as a job (202 and the job's URL) instead of holding the connection until the deadline answers 504.
The estimate is the request's *work* (images x steps x pixels) times the model's pace (seconds per
unit of work), an exponentially weighted mean over its recent generations. A generation that ran out
of its deadline counts with the time it had: its size is never estimated shorter again.

Pixels scale the work linearly; attention grows faster than that, and small images are dominated by
fixed costs, so from small generations a large one is over-estimated, i.e. sent to a job sooner than
necessary, which is the safe side. Until a model has run once there is no estimate and requests run
synchronously. State is per process and per Triton model (only models the gateway has checked reach
it, so the table is bounded by the repository).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GenerationPace", "generation_work"]

#: weight of the newest observation in the running mean
ALPHA = 0.3


def generation_work(images: int, steps: int, width: int, height: int) -> float:
    """Units of work of a generation: images x steps x megapixels."""
    return images * steps * width * height / 1e6


@dataclass
class GenerationPace:
    """Seconds per unit of work, per model (see the module docstring)."""

    def __post_init__(self) -> None:
        self._pace: dict[str, float] = {}

    def observe(self, model: str, work: float, seconds: float) -> None:
        """Record that ``work`` took ``seconds`` on ``model``."""
        if work <= 0 or seconds <= 0:
            return
        pace = seconds / work
        previous = self._pace.get(model)
        self._pace[model] = pace if previous is None else ALPHA * pace + (1 - ALPHA) * previous

    def estimate_s(self, model: str, work: float) -> float | None:
        """Seconds ``work`` should take on ``model``; ``None`` before it has run once."""
        pace = self._pace.get(model)
        return None if pace is None else pace * work
