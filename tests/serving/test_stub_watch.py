"""The stub watch against a real Triton: the stubs found in its process tree, their shared memory
removed at shutdown (Triton leaves it), and where a stub's memory limit comes from."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.launcher import TritonPorts, TritonServer
from serving.stub_watch import (
    MEMORY_LIMIT_ENV,
    MEMORY_LIMIT_PARAMETER,
    SHM_DIR,
    Stub,
    StubWatch,
    default_limit_mb,
    remove_regions,
    stub_processes,
)
from tests.support.tiny_repo import SLOW_MODEL, TINY_MODEL, build_tiny_repository


@pytest.mark.integration
def test_stubs_are_found_and_their_shared_memory_goes_at_shutdown(tmp_path: Path) -> None:
    server = TritonServer(
        build_tiny_repository(tmp_path / "repo"), ports=TritonPorts.free()
    ).start()
    try:
        assert server.pid is not None
        stubs = stub_processes(server.pid)
        assert sorted(s.model for s in stubs) == sorted([SLOW_MODEL] * 2 + [TINY_MODEL] * 2)
        assert all((SHM_DIR / s.region).exists() for s in stubs)
        assert StubWatch(server.pid, default_limit_mb=0).poll() == []  # all alive: nothing removed
    finally:
        server.stop()
    assert not [s.region for s in stubs if (SHM_DIR / s.region).exists()], (
        "Triton's stubs left /dev/shm regions"
    )


def test_the_limit_comes_from_the_model_config_then_the_environment(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    config = mc.ModelConfig(name="m", backend="python")
    config.parameters[MEMORY_LIMIT_PARAMETER].string_value = "123"
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
    watch = StubWatch(1, default_limit_mb=999)
    assert watch.limit_mb(Stub(2, "m", folder, "triton_x")) == 123
    assert watch.limit_mb(Stub(3, "n", tmp_path / "n", "triton_y")) == 999  # no config: the default
    assert default_limit_mb({MEMORY_LIMIT_ENV: "0"}) == 0
    assert default_limit_mb({}) > 0  # half the host's memory


def test_only_stub_region_names_are_ever_removed() -> None:
    assert (
        remove_regions({"../etc/passwd", "not_triton", "triton_gone_region_does_not_exist"}) == []
    )


def test_a_new_stub_that_reuses_a_dead_stubs_pid_does_not_hide_its_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unit test: the process table is stubbed; the regions are real files in /dev/shm.
    tag = uuid.uuid4().hex
    old, new = f"triton_test_{tag}_old", f"triton_test_{tag}_new"
    for region in (old, new):
        (SHM_DIR / region).touch()
    try:
        looks = iter([[Stub(42, "m", tmp_path, old)], [Stub(42, "m", tmp_path, new)], []])
        monkeypatch.setattr("serving.stub_watch.stub_processes", lambda pid: next(looks))
        watch = StubWatch(1, default_limit_mb=0)
        assert watch.poll() == []
        assert watch.poll() == [old]  # pid 42 is another stub now: the first one is gone
        assert (SHM_DIR / new).exists()
        assert watch.poll() == [new]
    finally:
        for region in (old, new):
            (SHM_DIR / region).unlink(missing_ok=True)
