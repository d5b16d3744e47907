"""``inferctl build``: models -> verified repository entries, with a summary table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

DEFAULT_REPOSITORY = Path("model_repository")


def parse_weights(pairs: list[str]) -> dict[str, str]:
    """``["resnet50=/ckpt/r50.pt"]`` -> ``{"resnet50": "/ckpt/r50.pt"}``."""
    weights = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(f"--weights takes MODEL=PATH, got '{pair}'")
        weights[name] = path
    return weights


def _weights_pair(text: str) -> str:
    parse_weights([text])  # argparse turns the ArgumentTypeError into a usage error naming the option
    return text


def add_build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                        help="model repository to write (default: %(default)s)")
    parser.add_argument("--weights", action="append", default=[], metavar="MODEL=PATH", type=_weights_pair,
                        help="local weights file or checkpoint folder for a model (repeatable)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")


def register(sub: argparse._SubParsersAction) -> None:
    from builders.registry import DEFAULT_MODELS, available

    parser = sub.add_parser(
        "build",
        help="export, verify and publish models",
        description="Export PyTorch models to ONNX, verify parity, build precision variants and publish "
        "versioned Triton entries. Only models whose inputs changed are rebuilt. "
        f"Known models: {', '.join(available())}.",
    )
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS),
                        help="models to build (default: %(default)s)")
    add_build_options(parser)
    parser.add_argument("--no-variants", action="store_true", help="skip FP16/INT8 variants")
    parser.add_argument("--engines", action="store_true",
                        help="also compile TensorRT engines (full TensorRT on a GPU host, or TensorRT-RTX)")
    parser.add_argument("--engine-compute-capability", metavar="CC",
                        help="TensorRT-RTX target, e.g. 8.9 for the RTX 4090 (full TensorRT builds for the local GPU)")
    parser.add_argument("--timing-cache", type=Path, help="TensorRT timing cache file (default: beside the repository)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from builders.errors import BuildError
    from builders.pipeline import BuildOptions, build, print_summary

    console = Console()
    options = BuildOptions(repository=args.repository, force=args.force, weights=parse_weights(args.weights),
                           variants=not args.no_variants, engines=args.engines, timing_cache=args.timing_cache,
                           engine_compute_capability=args.engine_compute_capability)
    try:
        reports = build(args.models, options, console=Console(stderr=True))
    except BuildError as exc:
        console.print(f"[red]build failed:[/red] {exc}")
        return 1
    print_summary(reports, console)
    return 0

