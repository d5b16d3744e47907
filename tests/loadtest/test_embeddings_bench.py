"""The embeddings benchmark's parts that need no servers (``python -m loadtest.bench.embeddings``).

The benchmark itself (Triton and the sentence-transformers baseline under load) is run as a command,
its output committed under ``benchmarks/``; what Triton's statistics show under mixed-length load is
asserted by ``tests/builders/test_text_embedding.py``. Here: the texts it sends, the time budget,
and redrawing a saved run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from builders.families.text_embedding import MAX_LENGTH, model_dir
from loadtest.bench.embeddings import _fitted_duration
from loadtest.bench.embeddings_report import Row
from loadtest.payloads import mixed_length_texts
from loadtest.registry import run_named
from serving.text_tokenization import load_tokenizer


def test_mixed_length_texts_are_fixed_and_of_many_lengths() -> None:
    texts = mixed_length_texts(256)
    assert texts == mixed_length_texts(256), "every run and configuration sends the same texts"
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    lengths = [len(tokenizer.encode(t).ids) for t in texts]
    assert len(set(lengths)) > 50, (
        "lengths vary: equal-shape batching alone would rarely merge them"
    )
    assert min(lengths) < 32 and max(lengths) > 128


def test_the_measured_time_shrinks_to_the_budget() -> None:
    args = argparse.Namespace(duration=5.0, warmup=0.5, rounds=1, deadline=None)
    assert _fitted_duration(args, 3) == 5.0
    args.deadline = time.monotonic() + 5.0 + 3 * (0.5 + 2.0)  # 5 s are kept for reporting
    assert 1.5 < _fitted_duration(args, 3) <= 2.0
    args.deadline = time.monotonic() - 10.0
    assert _fitted_duration(args, 3) == 0.5, "over budget: the shortest measurement, never none"


def test_a_saved_run_is_drawn_again(tmp_path: Path) -> None:
    rows = [
        Row("sentence-transformers (cpu)", 10.0, 90.0, 200.0, 150, 0, None, None),
        Row("triton", 25.0, 40.0, 120.0, 375, 0, 0.999999, 6.5),
    ]
    settings = {
        "encoder": "onnx",
        "device": "cpu",
        "concurrency": 16,
        "rounds": 3,
        "warmup": 1.0,
        "measured_s_per_round": 5.0,
    }
    saved = tmp_path / "saved.json"
    saved.write_text(
        json.dumps(
            {
                "settings": settings,
                "machine": "2 CPUs",
                "load_average": [1.0, 2.0],
                "rows": [r.__dict__ for r in rows],
            }
        )
    )
    assert (
        run_named("embeddings", ["--report-from", str(saved), "--out", str(tmp_path / "out")]) == 0
    )
    table = (tmp_path / "out" / "embeddings.txt").read_text()
    assert "2.50x" in table and "6.50" in table and "2 CPUs" in table
    assert (tmp_path / "out" / "embeddings.png").stat().st_size > 0
    assert (
        json.loads((tmp_path / "out" / "embeddings.json").read_text())["rows"][1]["texts_per_s"]
        == 25.0
    )
