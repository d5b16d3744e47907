"""Stable Diffusion through Triton on a GPU host, in one step (the diffusion step of ``gpu_bench.sh all``).

    loadtest/diffusion_gpu.sh wheels .whl/diffusion                       # HERE, with pip and network
    python -m loadtest.bench.gpu_diffusion --out DIR [diffusion_bench args]   # THERE

Runs :mod:`loadtest.diffusion_bench`: the SD 1.5 configuration randomly initialised (the shapes and
compute of the real model), built by the builders into ``stable_diffusion_torch`` (FP16) as a real
checkpoint would be, served by the embedded Triton and called over gRPC by concurrent clients,
against diffusers' own ``StableDiffusionPipeline`` (FP16) on the same GPU with the same seeds. By
default 512x512 / 25 steps and 768x768 / 50 steps at 1, 4 and 8 concurrent requests, one round each
(``--sizes``, ``--concurrency``, ``--rounds`` override). It writes ``bench.json``, ``bench.txt`` and
``bench.png`` in ``--out``.

The GPU host (``loadtest/gpu_bench.sh``: torch, transformers, numpy 2, no network) lacks two things,
taken from carried packs:

- diffusers, cut to what the run imports (``.whl/diffusion/``: ``diffusion_gpu.sh wheels``), unpacked
  into a private folder on the path of this process and of Triton's Python models;
- numpy 1.26 (``.whl/embeddings/``): the prompt is a string tensor, which Triton 2.51's Python stub
  cannot take under numpy 2, so the Python models get an interpreter of their own.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from loadtest.bench.carried import numpy1_interpreter, one, unpack_onto_path
from loadtest.registry import run_named

__all__ = ["build_parser", "run"]

DEFAULTS = [
    "--preset",
    "sd15",
    "--sizes",
    "512x512:25,768x768:50",
    "--concurrency",
    "1,4,8",
    "--rounds",
    "1",
]


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench gpu-diffusion``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--diffusers-pack", type=Path, default=Path(".whl") / "diffusion")
    parser.add_argument("--numpy-pack", type=Path, default=Path(".whl") / "embeddings")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench gpu-diffusion``: the parsed options in, the exit status out."""
    extra = args.forwarded
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="gpu-diffusion-") as tmp:
        work = Path(tmp)
        also: list[Path] = []
        try:
            import diffusers  # noqa: F401
        except ImportError:
            also.append(work / "diffusers-site")
            unpack_onto_path(
                one(
                    args.diffusers_pack,
                    "diffusers-*.zip",
                    f"loadtest/diffusion_gpu.sh wheels {args.diffusers_pack}",
                ),
                also[0],
            )
        stub = numpy1_interpreter(
            args.numpy_pack,
            work,
            check="torch,transformers,diffusers",
            also=also,
            hide=("sklearn", "scipy"),
        )
        # The caller's arguments come last: argparse keeps the last of a repeated option.
        bench = [
            "--out",
            str(args.out),
            "--device",
            args.device,
            "--workdir",
            str(work / "sd"),
            *DEFAULTS,
            *extra,
        ]
        if stub:
            bench += ["--stub-python", stub]
        return run_named("diffusion", bench)


if __name__ == "__main__":
    raise SystemExit(run_named("gpu-diffusion"))
