"""The test model repository: built for real from the PyTorch models, once, and reused.

Builds are hashed, so a second build of an unchanged model is a no-op. ``TEST_MODEL_REPOSITORY``
moves the repository (for example to share one build between checkouts).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROOT", "TEST_MODELS", "TEST_REPOSITORY"]

ROOT = Path(__file__).resolve().parents[2]
TEST_REPOSITORY = Path(
    os.environ.get("TEST_MODEL_REPOSITORY", ROOT / ".build" / "test-model-repository")
)

#: everything the integration tests expect Triton to serve; dependencies are added by the build
TEST_MODELS: tuple[str, ...] = (
    "efficientnet_lite0",
    "resnet50",
    "image_classifier",
    "text_embedding",
    "text_embedding_fp16",
)
