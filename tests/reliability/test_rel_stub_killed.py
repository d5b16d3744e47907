"""Fault 9 - a model's Python stub dies (killed, or over its memory limit) and the platform heals it.

A Triton of this module's own runs under :class:`serving.supervisor.TritonSupervisor` (which watches
the stubs: memory limits, ``/dev/shm``); a gateway in front of it takes a closed-loop load on
``slow_echo`` (a Python-backend model, two instances) and on ``tiny_linear``. One ``slow_echo`` stub,
found in Triton's process tree, gets ``kill -9``. Asserted (statuses, never timings): ``slow_echo``
answers only 200 or 503, its 503s carry Retry-After (the circuit breaker, and the answer of the dead
instance itself), it answers 200 again within the 30 s the test polls for, and then steadily;
``tiny_linear`` never fails meanwhile; the gateway counted a reload of ``slow_echo``; the dead stub's
shared-memory region is gone from ``/dev/shm``. Then a model over its stub memory limit: its stub
is killed alone by the watch, and the model is healed the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from loadtest.loadgen import HttpTarget, Sample, Samples, closed_loop
from serving.launcher import TritonPorts, TritonServer
from serving.stub_watch import MEMORY_LIMIT_PARAMETER, SHM_DIR, stub_processes
from serving.supervisor import TritonSupervisor
from tests.support.gateway_procs import METRICS_TOKEN, create_key
from tests.support.tiny_repo import SLOW_MODEL, TINY_MODEL, build_tiny_repository

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
SLOW_BODY = json.dumps(
    {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [1]}]}
).encode()
TINY_BODY = json.dumps(
    {
        "inputs": [
            {"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
        ]
    }
).encode()
RECOVERY_WINDOW_S = 30.0  # the promise: the model answers again within 30 s
STEADY_REQUESTS = 8  # in a row after recovery: every instance is a fresh one
HOG_MODEL = "memory_hog"
HOG_LIMIT_MB = 300
_HOG_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            megabytes = int(pb_utils.get_input_tensor_by_name(request, "MB").as_numpy().reshape(-1)[0])
            hold = np.ones(megabytes * 1024 * 1024, dtype=np.uint8)  # touched: resident, not just reserved
            # long enough for the watch to see it
            deadline = time.monotonic() + (10 if megabytes > 100 else 0)
            while time.monotonic() < deadline:
                time.sleep(0.05)
            out = pb_utils.Tensor("OUT", np.array([int(hold[-1]) if megabytes else 0], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def _hog_body(megabytes: int) -> dict[str, object]:
    return {"inputs": [{"name": "MB", "shape": [1], "datatype": "INT32", "data": [megabytes]}]}


@pytest.fixture(scope="module")
def healing_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The tiny models and ``memory_hog`` (a stub limit of 300 MiB), under the supervisor."""
    root = build_tiny_repository(tmp_path_factory.mktemp("healing-repository"))
    (root / HOG_MODEL / "1").mkdir(parents=True)
    (root / HOG_MODEL / "1" / "model.py").write_text(_HOG_PY)
    config = mc.ModelConfig(name=HOG_MODEL, backend="python", max_batch_size=0)
    config.input.add(name="MB", data_type=mc.TYPE_INT32, dims=[1])
    config.output.add(name="OUT", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.parameters[MEMORY_LIMIT_PARAMETER].string_value = str(HOG_LIMIT_MB)
    (root / HOG_MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    server = TritonServer(root, ports=TritonPorts.free())
    with TritonSupervisor(server.start(), poll_s=0.1, stub_poll_s=0.2):
        yield server


def _slow_ok(status: int, payload: bytes) -> bool | None:
    return None if status != 200 else json.loads(payload)["outputs"][0]["data"] == [1]


async def _poll(
    url: str,
    headers: dict[str, str],
    body: bytes,
    log: list[tuple[float, int, str | None]],
    stop: asyncio.Event,
) -> None:
    """POST ``body`` to ``url`` one at a time until ``stop``; log ``(sent, status, Retry-After)``."""
    async with httpx.AsyncClient(timeout=20) as client:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                response = await client.post(url, content=body, headers={**headers, **JSON})
                log.append((sent, response.status_code, response.headers.get("retry-after")))
            except httpx.HTTPError:
                log.append((sent, 0, None))
            await asyncio.sleep(0.05)


def _healed(log: list[tuple[float, int, str | None]], after: float) -> bool:
    """A 503 after ``after``, then ``STEADY_REQUESTS`` 200s in a row."""
    statuses = [status for sent, status, _ in log if sent > after]
    if 503 not in statuses:
        return False
    tail = statuses[statuses.index(503) :]
    return len(tail) > STEADY_REQUESTS and all(s == 200 for s in tail[-STEADY_REQUESTS:])


def _metric(gateway_url: str, name: str, labels: str) -> float:
    text = httpx.get(
        gateway_url + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    ).text
    prefix = f"{name}{{{labels}}} "
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def _stubs_without_region(triton_pid: int, grace_s: float = 15.0) -> list[int]:
    """Stubs that keep running without their ``/dev/shm`` region (pids).

    A stub the reload replaced can still be in Triton's process tree for a moment after Triton
    itself removed its region (python_backend's teardown unlinks the region, then waits for the
    stub to exit); only a stub still running without it after ``grace_s`` is a defect.
    """
    deadline = time.monotonic() + grace_s
    while True:
        missing = [s.pid for s in stub_processes(triton_pid) if not (SHM_DIR / s.region).exists()]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def test_a_killed_stub_is_replaced_while_the_breaker_answers_503(  # type: ignore[no-untyped-def]
    healing_triton, gateways
) -> None:
    gateway = gateways(healing_triton.http_url, log_level="warning", upstream_timeout_s=15)
    headers, _ = create_key(gateway)
    slow_url = gateway.url + f"/v2/models/{SLOW_MODEL}/infer"
    (victim, *_) = [s for s in stub_processes(healing_triton.pid) if s.model == SLOW_MODEL]
    assert (SHM_DIR / victim.region).exists()

    async def scenario() -> tuple[
        list[Sample], list[Sample], list[tuple[float, int, str | None]], float
    ]:
        stop = asyncio.Event()
        slow = HttpTarget(
            url=slow_url,
            requests=((SLOW_BODY, JSON),),
            headers=headers,
            check=_slow_ok,
            timeout_s=20,
        )
        tiny = HttpTarget(
            url=gateway.url + f"/v2/models/{TINY_MODEL}/infer",
            requests=((TINY_BODY, JSON),),
            headers=headers,
            timeout_s=20,
        )
        loads = [
            asyncio.create_task(closed_loop(t, concurrency=2, duration_s=120, stop=stop))
            for t in (slow, tiny)
        ]
        polled: list[tuple[float, int, str | None]] = []
        poller = asyncio.create_task(_poll(slow_url, headers, SLOW_BODY, polled, stop))
        while (
            sum(1 for _, status, _ in polled if status == 200) < 3
        ):  # traffic flows before the kill
            assert len(polled) < 200, f"slow_echo never answered before the kill: {polled[-3:]}"
            await asyncio.sleep(0.05)
        t_kill = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)  # the stub alone, as the OOM killer would
        while not _healed(polled, t_kill) and time.monotonic() - t_kill < RECOVERY_WINDOW_S:
            await asyncio.sleep(0.1)
        stop.set()
        slow_samples, tiny_samples = [list(samples) for samples in await asyncio.gather(*loads)]
        await poller
        return slow_samples, tiny_samples, polled, t_kill

    slow_samples, tiny_samples, polled, t_kill = asyncio.run(scenario())
    after = [(status, retry) for sent, status, retry in polled if sent > t_kill]
    print(f"\n[stub-kill] slow_echo load: {Samples.of(slow_samples).describe()}")
    print(f"[stub-kill] tiny_linear load: {Samples.of(tiny_samples).describe()}")
    print(f"[stub-kill] polled after the kill: {[s for s, _ in after]}")

    assert _healed(polled, t_kill), (
        f"slow_echo did not answer steadily again within {RECOVERY_WINDOW_S:.0f} s: {after}"
    )
    unavailable = [s for s in slow_samples if s.status == 503] + [s for s in after if s[0] == 503]
    assert unavailable, "no 503 while the model was being healed"
    assert all(s.retry_after for s in slow_samples if s.status == 503), "a 503 without Retry-After"
    assert all(retry for status, retry in after if status == 503), "a 503 without Retry-After"
    others = [s for s in slow_samples if s.status not in (200, 503)] + [
        s for s in after if s[0] not in (200, 503)
    ]
    assert not others, f"slow_echo answered other than 200/503: {others[:5]}"
    assert not [s for s in slow_samples if s.correct is False], "a wrong slow_echo answer"
    assert tiny_samples and all(s.status == 200 for s in tiny_samples), (
        f"tiny_linear failed while slow_echo was healed: {Samples.of(tiny_samples).describe()}"
    )
    assert (
        _metric(gateway.url, "gateway_model_reloads_total", f'model="{SLOW_MODEL}",outcome="ok"')
        >= 1
    )
    assert _metric(gateway.url, "gateway_model_breaker_open", f'model="{SLOW_MODEL}"') == 0
    assert victim.pid not in {s.pid for s in stub_processes(healing_triton.pid)}
    deadline = time.monotonic() + 10  # the supervisor's watch looks every 0.2 s
    while (SHM_DIR / victim.region).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (SHM_DIR / victim.region).exists(), (
        "the dead stub's shared memory was left in /dev/shm"
    )
    assert not _stubs_without_region(healing_triton.pid), "a live stub lost its shared memory"


def test_a_stub_over_its_memory_limit_dies_alone_and_is_healed(  # type: ignore[no-untyped-def]
    healing_triton, gateways
) -> None:
    gateway = gateways(healing_triton.http_url, log_level="warning", upstream_timeout_s=30)
    headers, _ = create_key(gateway)
    url = gateway.url + f"/v2/models/{HOG_MODEL}/infer"
    others_before = {s.pid for s in stub_processes(healing_triton.pid) if s.model != HOG_MODEL}
    with httpx.Client(timeout=40, headers=headers) as client:
        assert client.post(url, json=_hog_body(10)).status_code == 200
        (hog,) = [s for s in stub_processes(healing_triton.pid) if s.model == HOG_MODEL]
        greedy = client.post(url, json=_hog_body(2 * HOG_LIMIT_MB))
        assert greedy.status_code == 503 and greedy.headers.get("retry-after"), greedy.text
        statuses = []
        deadline = time.monotonic() + RECOVERY_WINDOW_S
        while time.monotonic() < deadline and statuses[-3:] != [200, 200, 200]:
            response = client.post(url, json=_hog_body(10))
            statuses.append(response.status_code)
            assert response.status_code in (200, 503), response.text
            time.sleep(0.1)
    assert statuses[-3:] == [200, 200, 200], f"memory_hog was not healed: {statuses}"
    assert hog.pid not in {s.pid for s in stub_processes(healing_triton.pid)}
    assert others_before <= {s.pid for s in stub_processes(healing_triton.pid)}, (
        "another model's stub died too"
    )
    log = Path(gateway.log_path).read_text()
    assert (
        f"model '{HOG_MODEL}': circuit breaker open" in log
        and f"model '{HOG_MODEL}': circuit breaker closed" in log
    )
