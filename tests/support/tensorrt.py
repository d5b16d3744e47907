"""The installed TensorRT flavour for the engine tests, or the test skipped with the reason."""

from __future__ import annotations

import pytest

from builders import engine

__all__ = ["tensorrt_or_skip"]


def tensorrt_or_skip() -> engine.TensorRT:
    """The flavour :func:`builders.engine.load_tensorrt` finds; where none imports, the calling test is
    skipped with :class:`builders.engine.EngineUnavailable`'s message (engines are never faked)."""
    try:
        return engine.load_tensorrt()
    except engine.EngineUnavailable as exc:
        pytest.skip(str(exc))
