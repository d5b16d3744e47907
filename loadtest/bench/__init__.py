"""The side-by-side benchmark: one invocation, one machine, the same model and the same offered load.

    python -m loadtest.bench                      # CPU: the full sweep (a few minutes)
    python -m loadtest.bench --quick              # a few seconds per configuration (the smoke test)
    python -m loadtest.bench --device cuda        # GPU: TorchScript FP16 through the pytorch backend
    python -m loadtest.bench --protocol grpc --shared-memory system   # the tensor path without payload copies

Configurations (all receive identical requests: one real photograph as an FP32 [1, 3, 224, 224]
tensor per request, from the platform's closed-loop load generator at a fixed concurrency):

- ``triton-batching``: Triton, dynamic batching on (the entry as the builders publish it);
- ``triton-no-batching``: the same model file, the entry's config copied with ``dynamic_batching``
  cleared (through the ``ModelConfig`` schema), so Triton runs one request per execution;
- ``gateway``: the FastAPI gateway in front of ``triton-batching`` (API key, KServe v2 passthrough);
- ``naive``: :mod:`loadtest.naive_server`, FastAPI + PyTorch eager, one forward per request;
- ``raw``: the runtime with no server at its best batch (ONNX Runtime on CPU, TorchScript on CUDA):
  the ceiling that gives the platform's efficiency ratio. Its throughput counts images per second.

Two more, not in the default set, send the photographs (and their mirror images) as JPEG files:

- ``gateway-jpeg``: the gateway in front of the ``image_classifier`` ensemble (decode, resize and
  normalise, the classifier, top 5), KServe v2 binary with a BYTES input; the repository must hold
  the ensemble and its steps (``inferctl up`` builds them);
- ``naive-jpeg``: the naive server's ``/classify``: the same decode and preprocessing function, the
  forward and the top 5 in one handler.

Every point is printed beside the load generator's own capacity with the same settings (against an
instant twin of the model), so a figure limited by the client shows as such. Thread settings are the
same everywhere: ONNX Runtime and PyTorch use their default intra-op thread count (the physical
cores) and one inter-op thread; the entry's own Triton instance count (the builders give two); one
naive server worker. Results: a
table on stdout, ``bench.json``, ``bench.png`` (latency against throughput, with the machine and
the settings) in ``--out``.

Modules: :mod:`~loadtest.bench.settings` (what a run does), :mod:`~loadtest.bench.servers` (gateway
and naive baseline), :mod:`~loadtest.bench.repository` (the entries), :mod:`~loadtest.bench.raw`
(the ceiling), :mod:`~loadtest.bench.side_by_side` (the run; :mod:`~loadtest.bench.first_answer`
checks each configuration's first answer), :mod:`~loadtest.bench.report` and
:mod:`~loadtest.bench.plot` (the output), :mod:`~loadtest.bench.cli` (the command), and
:mod:`~loadtest.bench.gateway_overhead` (what the gateway adds over direct Triton).
"""

from __future__ import annotations

from loadtest.bench.cli import build_parser, settings_from_args
from loadtest.bench.report import machine_description
from loadtest.bench.settings import ALL_CONFIGS, BenchSettings, Result
from loadtest.bench.side_by_side import run_bench

__all__ = [
    "ALL_CONFIGS",
    "BenchSettings",
    "Result",
    "build_parser",
    "machine_description",
    "run_bench",
    "settings_from_args",
]
