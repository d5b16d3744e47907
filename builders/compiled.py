"""Compiled flavours for hosts without full TensorRT: ``torch.export``, then Inductor.

    python -m builders.compiled --repository model_repository [--source efficientnet_lite0]
                                [--flavour inductor|aoti] [--device cuda|cpu]

The spec's module is converted as it is served (on the GPU: FP16 weights, channels_last) and
exported with a dynamic batch axis (1..``max_batch``). Then, by flavour:

- ``inductor`` (the default): the exported program is saved as ``exported.pt2`` and compiled by
  ``torch.compile`` (Inductor) when the entry loads. Nothing compiled is stored in the entry, so it
  loads wherever the same torch runs; the compile (minutes cold) is kept in Inductor's cache, which
  this build fills on its own host by compiling the same graph for its parity check. On the H200
  host of ``benchmarks/h200`` this is the compiled flavour that runs: AOTInductor packages segfault
  there when they load.
- ``aoti``: AOTInductor compiles ahead of time into one ``model.pt2`` package (generated kernels
  for the GPU it is built on, weights inside); GPU only, tied to that GPU architecture and torch.

Like every artifact it is checked against the FP32 PyTorch module on the spec's real sample inputs
(the FP16 variant's tolerance on the GPU, the FP32 one on the CPU), loaded exactly as the backend
loads it (:class:`~serving.backends.pytorch.torch_module.TorchModule`), and published with a build
report: parity, export and compile times, the in-process throughput beside the eager module it
replaces, device and versions.

The entry (``<source>_<flavour>``, ``platform: "pytorch_libtorch"``, ``default_model_filename``
the file above) is served by the platform's Python-based ``pytorch`` backend, which captures the
compiled calls into CUDA graphs like a TorchScript module's. The NGC container's native libtorch
backend loads neither file: on NGC, serve the TorchScript entry (or a TensorRT engine).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from builders.errors import BuildError
from builders.flavours.base import BuildRun
from builders.flavours.compiled import (
    DEFAULT_MAX_BATCH,
    FLAVOURS,
    CompiledFlavour,
    compiled_name,
)
from builders.flavours.walk import build_model
from builders.registry import get_spec
from builders.spec import ModelSpec

__all__ = [
    "DEFAULT_MAX_BATCH",
    "FLAVOURS",
    "CompiledFlavour",
    "compiled_name",
    "main",
    "publish_compiled",
]


def publish_compiled(repository: Path, compiled: CompiledFlavour) -> Path:
    """Export, compile, check and publish ``compiled.source`` as a compiled entry for this host.

    The steps are ``compiled``'s (:class:`builders.flavours.compiled.CompiledFlavour`: source, kind,
    device, entry name, batch range and batching), walked by
    :func:`builders.flavours.walk.build_model` like every flavour's. Making the flavour already
    refused an unknown kind or device, no CUDA device for ``device="cuda"`` and AOTInductor asked
    for the CPU (its packages are compiled for the GPU they are built on).

    Returns:
        The published version folder.

    Raises:
        BuildError: a source that is not a single-input PyTorch model.
        ParityError: the compiled module disagrees with PyTorch beyond the variant's tolerance.
    """
    spec = get_spec(compiled.source)
    if not isinstance(spec, ModelSpec) or len(spec.inputs) != 1:
        raise BuildError(f"{compiled.source} is not a single-input PyTorch model spec")
    report = build_model(spec, compiled, BuildRun(repository))[0]
    return repository / report.model / str(report.version)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m builders.compiled",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument(
        "--repository", type=Path, required=True, help="the model repository to publish into"
    )
    parser.add_argument(
        "--source", default="efficientnet_lite0", help="the PyTorch model spec to compile"
    )
    parser.add_argument(
        "--flavour",
        choices=sorted(FLAVOURS),
        default="inductor",
        help="inductor: torch.export program compiled at load (default); aoti: AOTInductor package",
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="where the entry serves"
    )
    parser.add_argument(
        "--name", default=None, help="the entry's name (default <source>_<flavour>)"
    )
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    args = parser.parse_args(argv)
    compiled = CompiledFlavour(
        args.source, args.flavour, args.device, name=args.name, max_batch=args.max_batch
    )
    print(publish_compiled(args.repository, compiled))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
