"""Embeddings that batch: Triton's ``text_embedding`` against sentence-transformers' ``encode``.

    python -m loadtest.bench.embeddings                       # CPU: concurrency 16, 3 alternating rounds
    python -m loadtest.bench.embeddings --buckets none 16,32,64,128 32,128 --no-ragged   # the batching study

Every configuration receives the same requests: one text per request, :func:`loadtest.payloads.
mixed_length_texts` round robin (12 to 250 tokens, mostly short), from the platform's load generator
(:mod:`loadtest.loadgen`) in a closed loop. Configurations:

- ``sentence-transformers``: :mod:`loadtest.naive_server` ``--task embeddings``: FastAPI calling
  ``SentenceTransformer.encode`` once per request (``--st-device``: cpu or cuda);
- ``triton``: the ``text_embedding`` ensemble as the builders publish it (ragged encoder inputs,
  requests of a batch run in the groups of similar length that cost least, by the build's
  ``ragged_run_cost``; :data:`~builders.families.text_embedding.GPU_RUN_COST` on CUDA);
- ``triton cost=C`` (``--run-costs``): the same with another run cost;
- ``triton buckets=E`` (``--buckets``): groups by the fixed length edges ``E`` instead (``none``: one
  group, padded to the batch's longest);
- ``triton no-ragged`` (``--no-ragged``): the encoder without ``allow_ragged_batch``, as before: the
  dynamic batcher merges only requests of equal length.

The encoder is the ONNX entry the builders publish (``--encoder onnx``, the onnxruntime backend, CPU)
or its TorchScript trace (``--encoder torchscript --device cuda``, the ``pytorch`` backend: how the
pipeline runs on a GPU host, see :mod:`loadtest.bench.gpu_embeddings`), same tensors, same raggedness.

Rounds alternate between configurations (short rounds, each configuration in every round), so a
neighbour's load on a shared machine falls on all of them alike; the load average is printed with the
table. Before any load, every Triton configuration embeds every text and is compared with ``encode``
of the same texts by the (first) baseline server, in one call: a configuration whose embeddings
differ (cosine below ``--min-cosine``) fails the run, as does any request that fails under load.
Percentiles come from :mod:`serving.quantiles`; the encoder's ``inference_count`` /
``execution_count`` come from Triton's statistics. Results: the table on stdout, and
``embeddings.txt`` (the table), ``embeddings.json`` (settings, machine, rows) and ``embeddings.png``
(throughput and P99) in ``--out``; ``--report-from embeddings.json`` draws the last two again from a
saved run (both: :mod:`loadtest.bench.
embeddings_report`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from loadtest.bench.embeddings_report import Row, describe_machine, report_saved, write_report
from loadtest.bench.embeddings_repository import (
    DEFAULT_REPOSITORY,
    ENCODER,
    build_source,
    prepare_repository,
    variant_name,
)
from loadtest.bench.servers import naive_embedding_server, start_triton
from loadtest.bench.triton_split import model_counters
from loadtest.loadgen import HttpTarget, LoadRun, LoadSpec, Target, TritonTarget, merge_runs
from loadtest.loadgen import run as run_specs
from loadtest.payloads import mixed_length_texts
from serving.launcher import TritonPorts
from serving.triton_clients import triton_client

__all__ = ["build_parser", "run", "run_bench"]


def _embed_all(url: str, model: str, texts: Sequence[str], concurrency: int) -> np.ndarray:
    """Every text through ``model``, one per request, ``concurrency`` in flight (so batches form).

    Through the client's own ``async_infer`` pool: the HTTP client is not thread-safe.
    """
    import tritonclient.http as http

    client = triton_client(url, concurrency=concurrency, network_timeout=300)
    vectors = []
    for start in range(0, len(texts), concurrency):
        pending = []
        for text in texts[start : start + concurrency]:
            tensor = http.InferInput("TEXT", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
            pending.append(client.async_infer(model, [tensor]))
        vectors += [p.get_result().as_numpy("EMBEDDING")[0] for p in pending]
    client.close()
    return np.stack(vectors)


def _st_embeddings(url: str, texts: Sequence[str]) -> np.ndarray:
    """sentence-transformers' ``encode`` of every text, by the baseline server (one call)."""
    request = urllib.request.Request(
        f"{url}/embed",
        data=json.dumps(list(texts)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return np.frombuffer(answer.read(), dtype="<f4").reshape(len(texts), -1)


def _encoder_counts(url: str, model: str) -> tuple[int, int]:
    counters = model_counters(url, model)
    return int(counters["inferences"]), int(counters["executions"])


def _targets(
    args: argparse.Namespace,
    triton_url: str,
    st_urls: dict[str, str],
    ensembles: dict[str, str],
    texts: Sequence[str],
) -> dict[str, Target]:
    targets: dict[str, Target] = {}
    for device, url in st_urls.items():
        targets[f"sentence-transformers ({device})"] = HttpTarget(
            url=f"{url}/embed",
            name="sentence-transformers",
            requests=tuple(
                (json.dumps([t]).encode(), {"Content-Type": "application/json"}) for t in texts
            ),
        )
    inputs = tuple({"TEXT": np.array([[t.encode()]], dtype=object)} for t in texts)
    for label, model in ensembles.items():
        targets[label] = TritonTarget(
            url=triton_url, model=model, inputs=inputs, outputs=("EMBEDDING",), name=label
        )
    return targets


def _machine_load() -> float:
    return os.getloadavg()[0]


def _fitted_duration(args: argparse.Namespace, configurations: int) -> float:
    """Seconds measured per configuration and round: ``--duration``, or less so that every round of
    every configuration ends before ``args.deadline`` (a ``time.monotonic()`` value; None: no limit)."""
    deadline = getattr(args, "deadline", None)
    if deadline is None:
        return float(args.duration)
    left = deadline - time.monotonic() - 5.0  # reporting and stopping the servers
    fitted = left / (configurations * args.rounds) - args.warmup
    if fitted < args.duration:
        print(
            f"{left:.0f} s left: {fitted:.1f} s per configuration and round instead of {args.duration:g}",
            flush=True,
        )
    return max(0.5, min(float(args.duration), fitted))


def run_bench(args: argparse.Namespace) -> list[Row]:
    """Build (if needed), start the servers, check parity, run the alternating rounds; the table's rows."""
    texts = mixed_length_texts(args.texts)
    source = build_source(Path(args.repository), args.encoder, args.device)
    variants: list[tuple[str, bool, dict[str, str]]] = [
        *((f"triton cost={c}", True, {"ragged_run_cost": c}) for c in args.run_costs),
        *(
            (
                f"triton buckets={b}",
                True,
                {"ragged_run_cost": "", "ragged_length_buckets": "" if b == "none" else b},
            )
            for b in args.buckets
        ),
    ]
    if args.no_ragged:
        variants.append(("triton no-ragged", False, {}))
    with (
        tempfile.TemporaryDirectory(prefix="bench-embeddings-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        ensembles = prepare_repository(source, work / "repository", variants, args.threads)
        # Ports first, in this thread, then the baseline servers start while Triton does (each loads
        # torch and the model: seconds that count against a budgeted run); each stack is entered by
        # one thread only.
        ports = TritonPorts.free()
        baselines = stack.enter_context(contextlib.ExitStack())
        with ThreadPoolExecutor(max_workers=1) as pool:
            starting = pool.submit(
                lambda: {
                    device: baselines.enter_context(
                        naive_embedding_server(device, work, args.threads)
                    )
                    for device in args.st_device
                }
            )
            triton = start_triton(work / "repository", ports, args.stub_python)
            stack.callback(triton.stop)
            st_urls = starting.result()
        # The parity reference: encode() of the first baseline server, every text in one call.
        reference = _st_embeddings(next(iter(st_urls.values())), texts)
        cosines: dict[str, float] = {}
        for label, model in ensembles.items():
            try:
                got = _embed_all(triton.http_url, model, texts, args.concurrency)
            except Exception:
                # The models answer a client with no internals; Triton's log has the cause.
                print(
                    "Triton's log, last 60 lines:\n" + "\n".join(list(triton.iter_log())[-60:]),
                    flush=True,
                )
                raise
            cosines[label] = float(
                np.min(
                    np.sum(got * reference, axis=1)
                    / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
                )
            )
            print(
                f"{label}: {len(texts)} texts, min cosine vs sentence-transformers {cosines[label]:.6f}",
                flush=True,
            )
        targets = _targets(args, triton.http_url, st_urls, ensembles, texts)
        duration = _fitted_duration(args, len(targets))
        runs: dict[str, list[LoadRun]] = {label: [] for label in targets}
        counts: dict[str, list[int]] = {label: [0, 0] for label in ensembles}
        loads = [_machine_load()]
        for number in range(args.rounds):
            for label, target in targets.items():
                encoder = ENCODER + ("" if label == "triton" else "__" + variant_name(label))
                before = _encoder_counts(triton.http_url, encoder) if label in ensembles else (0, 0)
                spec = LoadSpec(
                    target=target,
                    concurrency=args.concurrency,
                    duration_s=duration,
                    warmup_s=args.warmup,
                    name=label,
                )
                runs[label] += run_specs([spec], args.processes)
                if label in ensembles:
                    after = _encoder_counts(triton.http_url, encoder)
                    counts[label][0] += after[0] - before[0]
                    counts[label][1] += after[1] - before[1]
                loads.append(_machine_load())
            print(
                f"round {number + 1}/{args.rounds} done (load average {loads[-1]:.1f})", flush=True
            )
    rows = []
    for label, label_runs in runs.items():
        result = merge_runs(label_runs)
        inferences, executions = counts.get(label, (0, 0))
        rows.append(
            Row(
                label,
                result.throughput,
                result.p50_ms,
                result.p99_ms,
                result.requests,
                result.errors,
                cosines.get(label),
                inferences / executions if executions else None,
            )
        )
    write_report(args, rows, loads, duration, describe_machine(args, loads))
    return rows


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench embeddings``'s options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repository", default=str(DEFAULT_REPOSITORY), help="where text_embedding is built"
    )
    parser.add_argument("--out", default=".build/bench-embeddings")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--duration", type=float, default=5.0, help="measured seconds per configuration per round"
    )
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--texts", type=int, default=256, help="distinct texts sent round robin")
    parser.add_argument("--processes", type=int, default=1, help="load generator processes")
    parser.add_argument(
        "--st-device",
        nargs="+",
        default=["cpu"],
        help="sentence-transformers baselines (cpu, cuda)",
    )
    parser.add_argument(
        "--buckets",
        nargs="*",
        default=[],
        help="extra Triton configurations grouping by these length edges ('none': one group)",
    )
    parser.add_argument(
        "--run-costs",
        nargs="*",
        default=[],
        help="extra Triton configurations with these ragged_run_cost values",
    )
    parser.add_argument(
        "--no-ragged", action="store_true", help="add Triton without ragged batching (before)"
    )
    parser.add_argument("--min-cosine", type=float, default=0.9999)
    parser.add_argument(
        "--encoder",
        choices=["onnx", "torchscript"],
        default="onnx",
        help="the encoder entry: ONNX (onnxruntime backend, CPU) or TorchScript (pytorch backend)",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the TorchScript encoder runs",
    )
    parser.add_argument(
        "--stub-python", help="interpreter whose environment Triton's Python models use"
    )
    parser.add_argument(
        "--machine-note", default="", help="said of the machine in the table and embeddings.json"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads of both sides: PyTorch in the baseline, ONNX Runtime in Triton's "
        "encoder (0: each runtime's default, the physical cores). On a shared, busy machine "
        "1 avoids spinning thread pools stalling each other",
    )
    parser.add_argument(
        "--report-from",
        type=Path,
        metavar="JSON",
        help="only draw the table and plot of a saved embeddings.json into --out",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="finish within this many seconds: the measured seconds are cut to fit (0.5 s at least)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench embeddings``: the parsed options in, the exit status out."""
    args.deadline = time.monotonic() + args.budget_s if args.budget_s else None
    if args.report_from:
        report_saved(args.report_from, args.out)
        return 0
    rows = run_bench(args)
    failed = [
        r for r in rows if r.errors or (r.min_cosine is not None and r.min_cosine < args.min_cosine)
    ]
    for r in failed:
        print(
            f"FAILED: {r.config}: {r.errors} failed requests, min cosine {r.min_cosine}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("embeddings"))
