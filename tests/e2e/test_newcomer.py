"""A newcomer's first hour, end to end: the default stack as ``./run up`` starts it (``inferctl up``,
default models), ``/readyz`` 200, every default model answering through its public route, and a
killed Python stub healed (the model answers again within 30 s of bounded polling).

The steps are :mod:`loadtest.newcomer`'s (``python -m loadtest.newcomer OUT_DIR`` runs them on the
real ``./run up`` and records figures); here they run on the test repository, on free ports, and
assert statuses only.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from builders.registry import DEFAULT_STACK
from loadtest.newcomer import (
    DEFAULT_VICTIM,
    call_model,
    kill_stub,
    model_task,
    start_stack,
    wait_healed,
)
from serving.launcher import TritonPorts
from serving.ports import reserve_port
from serving.stub_watch import stub_processes

pytestmark = pytest.mark.integration


def test_default_stack_is_ready_answers_and_heals_a_killed_stub(
    model_repository: Path, tmp_path: Path
) -> None:
    ports = TritonPorts.free()
    gateway_port = reserve_port()
    args = [
        "--repository",
        str(model_repository),
        "--triton-http-port",
        str(ports.http),
        "--triton-grpc-port",
        str(ports.grpc),
        "--triton-metrics-port",
        str(ports.metrics),
        "--gateway-port",
        str(gateway_port),
        "--gateway-grpc-port",
        str(reserve_port()),
    ]
    with start_stack(args, tmp_path / "state", gateway_port, timeout_s=600) as stack:
        ready = stack.wait_ready(timeout_s=300)
        assert ready.status_code == 200, ready.text
        models = ready.json()["models"]
        assert set(models) == set(DEFAULT_STACK), models  # /readyz checks every default model

        tasks = {model: model_task(stack, model) for model in models}
        for model in models:
            response = call_model(stack, model, tasks[model])
            assert response.status_code == 200, (
                f"{model}: {response.status_code} {response.text[:300]}"
            )

        public, dying = DEFAULT_VICTIM
        triton_pid = stack.triton_pid()
        victim = kill_stub(triton_pid, dying)
        killed_at = time.monotonic()
        statuses: list[int] = []

        def call() -> int:
            response = call_model(stack, public, tasks[public], timeout_s=30)
            statuses.append(response.status_code)
            if response.status_code == 503:
                assert response.headers.get("retry-after"), response.text
            return response.status_code

        recovery = wait_healed(call, killed_at)
        assert recovery is not None, (
            f"{public} did not answer steadily again within 30 s: {statuses}\n{stack.process.log_tail(40)}"
        )
        assert set(statuses) <= {200, 503}, statuses
        assert victim.pid not in {s.pid for s in stub_processes(triton_pid)}
        others = [m for m in models if m != public]
        for model in others:  # nothing else failed
            assert call_model(stack, model, tasks[model]).status_code == 200, model
        assert httpx.get(stack.base_url + "/readyz", timeout=60).status_code == 200
        print(
            f"\n[newcomer] {public} answered again {recovery:.1f} s after its {dying} stub was "
            f"killed: {statuses}"
        )
    assert stack.process.returncode == 0, stack.process.log_tail()
