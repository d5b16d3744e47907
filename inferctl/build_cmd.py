"""``inferctl build``: models -> verified repository entries, with a summary table."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from inferctl.command import Command
from serving.console import JSON_SCHEMA, json_document, make_console, quiet_library_progress

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
    # argparse turns the ArgumentTypeError into a usage error naming the option
    parse_weights([text])
    return text


def add_repository_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--repository``, by default :data:`DEFAULT_REPOSITORY`: ``what`` it is to the command, for --help."""
    parser.add_argument(
        "--repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help=f"{what} (default: %(default)s)",
    )


def add_weights_option(parser: argparse.ArgumentParser, text: str) -> None:
    """``--weights MODEL=PATH``, repeatable (:func:`parse_weights` reads the values); ``text`` is
    its --help."""
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="MODEL=PATH",
        type=_weights_pair,
        help=text,
    )


def add_build_options(parser: argparse.ArgumentParser) -> None:
    add_repository_option(parser, "model repository to write")
    add_weights_option(parser, "local weights file or checkpoint folder for a model (repeatable)")
    parser.add_argument(
        "--force", action="store_true", help="rebuild even when the inputs are unchanged"
    )
    parser.add_argument(
        "--build-cache",
        type=Path,
        metavar="DIR",
        help="entries kept by their inputs' hash and reused by any repository of this machine "
        "(default: $TRITON_PLATFORM_BUILD_CACHE, else ~/.cache/triton-platform/builds)",
    )
    parser.add_argument(
        "--no-build-cache", action="store_true", help="neither reuse nor keep cached builds"
    )
    parser.add_argument(
        "--int8-calibration-study",
        action="store_true",
        help="calibrate INT8 variants by every method their spec names and keep the best on "
        "held-out inputs (default: the spec's measured best alone; the study takes ~3x as long)",
    )


def build_cache_dir(args: argparse.Namespace) -> Path | None:
    """The build cache the options name (None: off)."""
    from builders.build_cache import default_cache_dir

    return None if args.no_build_cache else (args.build_cache or default_cache_dir())


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print {what} as JSON on stdout, as every command's --json does: "
        f'{{"schema": "{JSON_SCHEMA}", "command": ..., "results": [...]}} '
        "(progress and messages stay on stderr)",
    )


def _description() -> str:
    from builders.registry import available

    return (
        "Export PyTorch models to ONNX, verify parity, build precision variants and publish "
        "versioned Triton entries. Only models whose inputs changed are rebuilt. "
        f"Known models: {', '.join(available())}."
    )


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from builders.registry import DEFAULT_MODELS

    parser.add_argument(
        "models",
        nargs="*",
        default=list(DEFAULT_MODELS),
        help="models to build (default: %(default)s)",
    )
    add_build_options(parser)
    parser.add_argument("--no-variants", action="store_true", help="skip FP16/INT8 variants")
    parser.add_argument(
        "--engines",
        action="store_true",
        help="also compile TensorRT engines (full TensorRT on a GPU host, or TensorRT-RTX)",
    )
    parser.add_argument(
        "--engine-compute-capability",
        metavar="CC",
        help="TensorRT-RTX target, e.g. 8.9 for the RTX 4090 (full TensorRT builds for the local GPU)",
    )
    parser.add_argument(
        "--triton-release",
        metavar="YY.MM",
        help="the NGC Triton release that serves the repository (default: the platform's image, "
        "docker/triton.Dockerfile): an engine becomes a tensorrt_plan entry only when that Triton's "
        "TensorRT version and GPU can load it (read from engine.json); TensorRT-RTX engines and "
        "others are kept as artifacts in <repository>-engine-artifacts/",
    )
    parser.add_argument(
        "--timing-cache",
        type=Path,
        help="TensorRT timing cache file (default: beside the repository)",
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the repository is for a GPU host: ONNX entries get KIND_GPU instances and the TensorRT "
        "execution accelerator (the TorchScript flavour too runs KIND_GPU, FP16)",
    )
    parser.add_argument(
        "--native-backends",
        action="store_true",
        help="the repository is for Triton's native backends (the NGC container): no allow_ragged_batch "
        "on the text encoder's inputs (native backends take a ragged input only as one flat tensor); "
        "mixed-length texts then batch only when their lengths are equal",
    )
    parser.add_argument(
        "--torchscript",
        action="store_true",
        help="also publish <model>_torchscript (pytorch_libtorch) for every PyTorch model named",
    )
    add_json_option(parser, "the build reports")


def run(args: argparse.Namespace) -> int:
    from builders.errors import BuildError
    from builders.pipeline import BuildOptions, build, print_summary
    from builders.registry import get_spec
    from builders.spec import ModelSpec
    from builders.torchscript import TorchScriptOptions, build_torchscript

    console, errors = make_console(), make_console(stderr=True)
    quiet_library_progress(errors)
    options = BuildOptions(
        repository=args.repository,
        force=args.force,
        weights=parse_weights(args.weights),
        variants=not args.no_variants,
        engines=args.engines,
        timing_cache=args.timing_cache,
        engine_compute_capability=args.engine_compute_capability,
        gpu=args.gpu,
        native_backends=args.native_backends,
        triton_release=args.triton_release,
        cache=build_cache_dir(args),
        int8_calibration_study=args.int8_calibration_study,
    )
    try:
        reports = build(args.models, options, console=errors)
        if args.torchscript:
            flavour = TorchScriptOptions(gpu=args.gpu, precision="fp16" if args.gpu else "fp32")
            reports += [
                build_torchscript(args.repository, name, flavour, force=args.force)
                for name in args.models
                if isinstance(get_spec(name, options.weights), ModelSpec)
            ]
    except BuildError as exc:
        errors.print(f"[red]build failed:[/red] {exc}")
        return 1
    if args.json:
        print(json_document("build", [asdict(r) for r in reports]))
    else:
        print_summary(reports, console)
    return 0


COMMAND = Command(
    name="build",
    help="export, verify and publish models",
    description=_description,
    add_arguments=_add_arguments,
    run=run,
)
