"""The eager PyTorch module's outputs on a spec's real sample inputs: what served artifacts must match."""

from __future__ import annotations

import numpy as np

from builders.export import torch_reference
from builders.registry import get_spec
from builders.spec import ModelSpec

__all__ = ["sample_reference"]


def sample_reference(source: str = "efficientnet_lite0") -> tuple[np.ndarray, np.ndarray]:
    """(sample inputs, eager PyTorch outputs) of a single-input, single-output model spec."""
    spec = get_spec(source)
    assert isinstance(spec, ModelSpec)
    module, _ = spec.load()
    feeds = spec.sample_inputs()
    return feeds[spec.inputs[0].name], torch_reference(module, spec, feeds)[0]
