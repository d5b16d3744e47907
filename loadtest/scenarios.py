"""Scenario names -> locust User classes in ``loadtest/locustfile.py``.

Kept apart from the locustfile on purpose: importing locust monkey-patches the process with gevent,
which deadlocks a process that already runs threads (a test session, the benchmark). The runner
only needs these names; locust itself runs in a subprocess.
"""

from __future__ import annotations

import json

__all__ = ["SCENARIOS", "describe"]

SCENARIOS: dict[str, str] = {
    "classify": "ClassifyUser",
    "embeddings": "EmbeddingsUser",
    "generation": "ImageGenerationUser",
    "v2": "V2TensorUser",
    "free": "FreeTierUser",
    "standard": "StandardTierUser",
    "premium": "PremiumTierUser",
}


def describe() -> str:
    """The scenarios as JSON (for ``loadtest.run --list``)."""
    return json.dumps(SCENARIOS, indent=2)
