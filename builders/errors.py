"""Build errors. Each stops the build with a message that names the problem; nothing is published.

BuildError
├── UnknownModelError      a name no spec answers to
├── MissingInputError      a checkpoint folder or weights file that is not there
├── ParityError            an artifact drifted past its tolerance from the PyTorch reference
├── PrecisionError         an FP16/INT8 conversion failed (unreadable graph, unfit calibration inputs)
└── EngineBuildError       TensorRT could not parse or build the ONNX graph
"""

from __future__ import annotations

__all__ = [
    "BuildError",
    "EngineBuildError",
    "MissingInputError",
    "ParityError",
    "PrecisionError",
    "UnknownModelError",
]


class BuildError(Exception):
    """A build step failed; the served repository was left as it was."""


class UnknownModelError(BuildError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown model '{name}'; known models: {', '.join(sorted(known))}")
        self.name = name


class MissingInputError(BuildError):
    pass


class ParityError(BuildError):
    pass


class PrecisionError(BuildError):
    """A precision conversion failed (unreadable graph, calibration inputs that do not fit)."""


class EngineBuildError(BuildError):
    pass
