"""``python -m loadtest.batcher_wakeup``: the configurations are what their labels say, and a short run
serves all of them from the real Triton and writes its table, JSON and plot. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.triton_config import read_config
from loadtest.batcher_wakeup import CONFIGS, WakeupSettings, configure, prepare_repository
from loadtest.registry import run_named


def test_each_configuration_sets_instances_queues_and_spinning(model_repository: Path) -> None:
    base = read_config(model_repository / "efficientnet_lite0" / "config.pbtxt")
    assert (
        base.dynamic_batching.priority_levels > 0
    )  # the builders' queues, which the copies keep or drop
    for label, setup in CONFIGS.items():
        config = configure(base, f"copy_{setup.suffix}", setup)
        assert config.name == f"copy_{setup.suffix}", label
        assert [g.count for g in config.instance_group] == [setup.instances], label
        assert (config.dynamic_batching.priority_levels > 0) == setup.queues, label
        assert config.dynamic_batching.HasField("default_queue_policy") == setup.queues, label
        assert config.parameters["allow_spinning"].string_value == (
            "1" if setup.spinning else "0"
        ), label
        # Everything else is the built entry's: same model file, same batching.
        assert config.default_model_filename == base.default_model_filename, label
        assert list(config.dynamic_batching.preferred_batch_size) == list(
            base.dynamic_batching.preferred_batch_size
        )


def test_the_copies_share_the_built_model_file(model_repository: Path, tmp_path: Path) -> None:
    names = prepare_repository(tmp_path, WakeupSettings(repository=model_repository))
    entry = model_repository / "efficientnet_lite0"
    versions = [p.name for p in entry.iterdir() if p.is_dir() and p.name.isdigit()]
    assert versions
    for name in names.values():
        for version in versions:
            copied = tmp_path / name / version / "model.onnx"
            assert copied.read_bytes() == (entry / version / "model.onnx").read_bytes()
        assert read_config(tmp_path / name / "config.pbtxt").name == name


@pytest.mark.integration
def test_a_short_run_writes_the_table_json_and_plot(
    model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The window outlasts the stall the one-instance configurations exist to show (the batcher's
    # 500 ms wait, plus an inference on a busy machine): a 0.5 s window once held no answer at all.
    assert (
        run_named(
            "batcher-wakeup",
            [
                "--repository",
                str(model_repository),
                "--concurrency",
                "1",
                "--warmup",
                "0.3",
                "--duration",
                "2",
                "--out",
                str(tmp_path),
            ],
        )
        == 0
    )
    assert "queue policies and instances" in capsys.readouterr().out
    document = json.loads((tmp_path / "batcher_wakeup.json").read_text())
    assert {row["config"] for row in document["rows"]} == set(CONFIGS)
    for row in document["rows"]:
        assert row["errors"] == 0 and row["requests"] > 0, row
    assert (tmp_path / "batcher_wakeup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_refuses_a_missing_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        run_named("batcher-wakeup", ["--repository", str(tmp_path), "--model", "nothing_here"])
    assert "no entry nothing_here" in capsys.readouterr().err
