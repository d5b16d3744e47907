"""PyTorch -> ONNX with a dynamic batch axis and a fixed opset, checked by ``onnx.checker``.

A protobuf cannot exceed 2 GiB, so a model whose weights come near that (a real Stable Diffusion
1.5 UNet in FP32 is 3.4 GB) is saved with its tensors in ONNX *external data*: one file
``model.onnx.data`` beside ``model.onnx``, referenced from it by relative name. :func:`onnx_files`
names every file a graph needs, so publishing copies (and hashes) them all; ONNX Runtime finds the
data file beside the graph, in a build and in Triton alike.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builders.spec import ModelSpec

__all__ = [
    "EXTERNAL_DATA_THRESHOLD_BYTES",
    "ExportResult",
    "export_onnx",
    "onnx_files",
    "save_onnx",
    "select_output",
    "torch_reference",
]

#: weights above this size go to external data (the protobuf limit is 2 GiB; graph and attributes
#: need room too)
EXTERNAL_DATA_THRESHOLD_BYTES = 1_800_000_000


@dataclass(frozen=True)
class ExportResult:
    path: Path
    seconds: float
    opset: int
    #: the external data file beside ``path``, if the weights went there
    external_data: Path | None = None

    def files(self) -> dict[str, Path]:
        """Every file of the graph, by the name it must have beside ``model.onnx``."""
        return onnx_files(self.path)


def onnx_files(path: Path, name: str = "model.onnx") -> dict[str, Path]:
    """``path`` as ``name`` plus every external data file it references, by its referenced name.

    Raises:
        FileNotFoundError: a referenced external data file is missing.
    """
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    files = {name: path}
    model = onnx.load(str(path), load_external_data=False)
    for tensor in _tensors(model.graph):
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            source = path.parent / location
            if not source.is_file():
                raise FileNotFoundError(
                    f"{path.name} references external data {location}, which is not beside it"
                )
            files[location] = source
    return files


def _tensors(graph: Any) -> Iterator[Any]:
    """Initializers and attribute tensors of ``graph`` and its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def save_onnx(model: Any, path: Path, *, external_data: bool) -> Path:
    """Save an ``onnx.ModelProto`` at ``path``; with ``external_data`` its tensors go to one file
    ``<path name>.data`` beside it (any older one is replaced)."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    if external_data:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))
    return path


def _wants_external_data(module: object, spec: ModelSpec) -> bool:
    if spec.onnx_external_data is not None:
        return spec.onnx_external_data
    import torch

    assert isinstance(module, torch.nn.Module)
    size = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    return size > EXTERNAL_DATA_THRESHOLD_BYTES


def select_output(model: object, output: str, argument_names: Sequence[str]) -> object:
    """Wrap a model that returns a ``ModelOutput`` so the traced graph takes positional tensors and
    returns one plain tensor (``model(**{names: tensors}).<output>``)."""
    import torch

    class SelectOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            named = dict(zip(argument_names, tensors, strict=True))
            return getattr(self.model(**named), output)  # type: ignore[operator]

    return SelectOutput().eval()


def torch_reference(
    module: object, spec: ModelSpec, feeds: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """Run the PyTorch module on ``feeds``; the ground truth every artifact is compared with."""
    import torch

    with torch.inference_mode():
        args = [torch.from_numpy(feeds[t.name]) for t in spec.inputs]
        out = module(*args)  # type: ignore[operator]
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o.detach().cpu().numpy() for o in outs]


def export_onnx(
    module: object, spec: ModelSpec, feeds: Mapping[str, np.ndarray], path: Path
) -> ExportResult:
    """Export ``module`` traced on ``feeds``; every input and output gets a dynamic batch axis.

    Weights over :data:`EXTERNAL_DATA_THRESHOLD_BYTES` (or any, when ``spec.onnx_external_data``)
    are written to ``<path name>.data`` beside ``path``. The trace runs on the first two rows only:
    the batch axis is dynamic anyway, and the tracer holds every intermediate tensor (8 GB for
    efficientnet_lite0 on 88 calibration photographs).
    """
    import onnx
    import torch

    started = time.perf_counter()
    external = _wants_external_data(module, spec)
    # The exporter writes one file per tensor beside a graph over 2 GiB: export into a folder of its
    # own, then gather the tensors into the one data file that is published.
    scratch = path.parent / f".{path.stem}-export"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    traced = scratch / path.name
    args = tuple(torch.from_numpy(feeds[t.name][:2]) for t in spec.inputs)
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
            str(traced),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamic_axes=axes,
            opset_version=spec.opset,
            do_constant_folding=True,
            dynamo=False,
        )
    if external:
        save_onnx(onnx.load(str(traced)), path, external_data=True)
    else:
        path.unlink(missing_ok=True)
        shutil.move(str(traced), str(path))
    shutil.rmtree(scratch, ignore_errors=True)
    # By path, so the checker reads external data too (and models over 2 GiB can be checked at all).
    onnx.checker.check_model(str(path), full_check=True)
    data = path.with_name(path.name + ".data")
    return ExportResult(
        path=path,
        seconds=time.perf_counter() - started,
        opset=spec.opset,
        external_data=data if external else None,
    )
