"""PyTorch -> ONNX with a dynamic batch axis and a fixed opset, checked by ``onnx.checker``."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builders.spec import ModelSpec

__all__ = ["ExportResult", "export_onnx", "select_output", "torch_reference"]


@dataclass(frozen=True)
class ExportResult:
    path: Path
    seconds: float
    opset: int


def select_output(model: object, output: str, argument_names: Sequence[str]) -> object:
    """Wrap a model that returns a ``ModelOutput`` so the traced graph takes positional tensors and
    returns one plain tensor (``model(**{names: tensors}).<output>``)."""
    import torch

    class SelectOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return getattr(self.model(**dict(zip(argument_names, tensors, strict=True))), output)  # type: ignore[operator]

    return SelectOutput().eval()


def torch_reference(module: object, spec: ModelSpec, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the PyTorch module on ``feeds``; the ground truth every artifact is compared with."""
    import torch

    with torch.inference_mode():
        args = [torch.from_numpy(feeds[t.name]) for t in spec.inputs]
        out = module(*args)  # type: ignore[operator]
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o.detach().cpu().numpy() for o in outs]


def export_onnx(module: object, spec: ModelSpec, feeds: dict[str, np.ndarray], path: Path) -> ExportResult:
    """Export ``module`` traced on ``feeds``; every input and output gets a dynamic batch axis."""
    import onnx
    import torch

    started = time.perf_counter()
    args = tuple(torch.from_numpy(feeds[t.name]) for t in spec.inputs)
    axes = {t.name: {0: "batch"} for t in (*spec.inputs, *spec.outputs)}
    for t in (*spec.inputs, *spec.outputs):
        for i, d in enumerate(t.dims, start=1):
            if d == -1:
                axes[t.name][i] = f"{t.name}_{i}"
    with warnings.catch_warnings():
        # The TorchScript exporter warns about tracing details we check by parity instead.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,  # type: ignore[arg-type]
            args,
            str(path),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamic_axes=axes,
            opset_version=spec.opset,
            do_constant_folding=True,
            dynamo=False,
        )
    onnx.checker.check_model(str(path), full_check=True)
    return ExportResult(path=path, seconds=time.perf_counter() - started, opset=spec.opset)
