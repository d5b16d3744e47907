"""``<model>_torchscript``: a registry model built as the TorchScript flavour.

    build_torchscript(Path("model_repository"), "efficientnet_lite0", TorchScriptOptions(gpu=True))

The steps (trace, parity vs the eager module, the ``pytorch_libtorch`` entry) are
:class:`builders.flavours.torchscript.TorchScriptFlavour`'s, walked by
:func:`builders.flavours.walk.build_model` like every flavour's.
"""

from __future__ import annotations

from pathlib import Path

from builders.errors import BuildError
from builders.flavours.base import BuildRun
from builders.flavours.torchscript import (
    TorchScriptFlavour,
    TorchScriptOptions,
    pinned_devices,
    torchscript_name,
    trace_for_device,
)
from builders.flavours.walk import build_model
from builders.registry import get_spec
from builders.report import BuildReport
from builders.spec import ModelSpec

__all__ = [
    "TorchScriptOptions",
    "build_torchscript",
    "pinned_devices",
    "torchscript_name",
    "trace_for_device",
]

_DEFAULT_OPTIONS = TorchScriptOptions()


def build_torchscript(
    repository: Path,
    source: str,
    options: TorchScriptOptions = _DEFAULT_OPTIONS,
    *,
    force: bool = False,
) -> BuildReport:
    """Trace ``source``'s module, check it, and publish it as ``<source>_torchscript`` (unless current).

    Args:
        repository: the Triton model repository to publish into.
        source: a registry name whose spec is a PyTorch model (:class:`ModelSpec`).

    Returns:
        The entry's build report (``skipped`` when it was already current).

    Raises:
        BuildError: ``source`` is not a PyTorch model.
        ParityError: the traced module disagrees with the eager one beyond the spec's tolerance.
    """
    spec = get_spec(source)
    if not isinstance(spec, ModelSpec):
        raise BuildError(f"{source} is not a PyTorch model, so it has no TorchScript flavour")
    flavour = TorchScriptFlavour(options, source)
    return build_model(spec, flavour, BuildRun(repository, force=force))[0]
