"""Cancellation end to end: work nobody waits for is dropped from Triton's queue, never run
(real gateway over gRPC, real Triton).

Both ``slow_echo`` instances are held by requests sent straight to Triton, so a request through the
gateway can only wait in Triton's queue; Triton's own ``nv_inference_pending_request_count`` says
when it is there. Then its client leaves, or its deadline passes: the gateway cancels the RPC, and
Triton drops the cancelled request when it next forms a batch (it checks cancellation there, not
while the request sits in the queue). So once the instances are released the queue is empty and
the abandoned request's marker ``DELAY_MS`` never ran. Over HTTP, Triton (2.51) cannot be told a
request was abandoned; there only the deadline, sent as the request's queue timeout, drops it.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from serving.launcher import TritonServer
from tests.support.gateway_procs import GatewayProcess, create_key, tiny_request
from tests.support.tiny_repo import SLOW_MODEL, TINY_MODEL, release_slow, slow_executions

pytestmark = pytest.mark.integration

_INSTANCES = 2  # slow_echo's


def _pending(triton: TritonServer) -> int:
    """Requests Triton holds in ``slow_echo``'s queue, from its own metrics."""
    text = httpx.get(triton.metrics_url, timeout=10).text
    pattern = r'^nv_inference_pending_request_count\{[^}]*model="' + SLOW_MODEL + r'"[^}]*\} (\S+)$'
    found = re.search(pattern, text, re.M)
    assert found, "Triton exports no pending-request count for slow_echo"
    return int(float(found.group(1)))


def _wait(condition, what: str, rounds: int = 600) -> None:  # type: ignore[no-untyped-def]
    for _ in range(rounds):  # bounded; each round is a real round trip to Triton's metrics
        if condition():
            return
    raise AssertionError(f"never: {what}")


def _body(delay_ms: int) -> dict[str, object]:
    return {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [delay_ms]}]}


@dataclass
class Held:
    """Requests holding every instance, and how to let them go."""

    triton: TritonServer
    holds: list[int]
    answers: list[Future[httpx.Response]]

    def release(self) -> None:
        assert not any(f.done() for f in self.answers), (
            "the instances were freed before the request was dropped"
        )
        for hold in self.holds:
            release_slow(self.triton.repository, hold)
        for future in self.answers:
            assert future.result(timeout=120).status_code == 200


@pytest.fixture(scope="module")
def hold_numbers() -> Iterator[int]:
    return itertools.count(1600)  # a released hold stays released: each test holds with new numbers


@pytest.fixture
def held(tiny_triton: TritonServer, hold_numbers: Iterator[int]) -> Iterator[Held]:
    """Both instances busy with requests sent straight to Triton, until the test ends."""
    url = f"http://{tiny_triton.http_url}/v2/models/{SLOW_MODEL}/infer"
    holds = [next(hold_numbers) for _ in range(_INSTANCES)]
    with ThreadPoolExecutor(_INSTANCES) as pool:
        held = Held(
            tiny_triton,
            holds,
            [pool.submit(httpx.post, url, json=_body(-h), timeout=120) for h in holds],
        )
        try:
            # metrics first: its round trip paces the loop
            _wait(
                lambda: (
                    _pending(tiny_triton) == 0
                    and all(-h in slow_executions(tiny_triton.repository) for h in holds)
                ),
                "both instances held",
            )
            yield held
        finally:
            for hold in holds:
                release_slow(tiny_triton.repository, hold)


@pytest.fixture(scope="module")
def grpc_gateway(  # type: ignore[no-untyped-def]
    gateway_factory, tiny_triton: TritonServer
) -> GatewayProcess:
    return gateway_factory(
        tiny_triton.http_url,
        triton_protocol="grpc",
        triton_grpc_url=tiny_triton.grpc_url,
        upstream_timeout_s=60,
    )


def test_a_client_that_leaves_is_dropped_from_tritons_queue(
    grpc_gateway: GatewayProcess, tiny_triton: TritonServer, held: Held
) -> None:
    marker = 311
    auth, _ = create_key(grpc_gateway)
    body = json.dumps(_body(marker)).encode()
    host, port = grpc_gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(
            f"POST /v2/models/{SLOW_MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {auth['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        _wait(lambda: _pending(tiny_triton) == 1, "the request waits in Triton's queue")
    _wait(
        lambda: "client disconnected; its request is cancelled" in grpc_gateway.log(),
        "the gateway noticed",
    )
    # One more RPC on the gateway's channel: its answer comes after the cancelled stream's reset.
    answer = httpx.post(
        grpc_gateway.url + f"/v2/models/{TINY_MODEL}/infer", json=tiny_request(), headers=auth
    )
    assert answer.status_code == 200, answer.text
    held.release()
    _wait(lambda: _pending(tiny_triton) == 0, "Triton's queue is empty")
    assert marker not in slow_executions(tiny_triton.repository)


def test_a_request_past_its_deadline_is_dropped_from_tritons_queue(
    gateway_factory, tiny_triton: TritonServer, held: Held
) -> None:  # type: ignore[no-untyped-def]
    marker = 312
    gateway = gateway_factory(
        tiny_triton.http_url,
        triton_protocol="grpc",
        triton_grpc_url=tiny_triton.grpc_url,
        upstream_timeout_s=1.5,
    )
    auth, _ = create_key(gateway)
    answer = httpx.post(
        gateway.url + f"/v2/models/{SLOW_MODEL}/infer", json=_body(marker), headers=auth, timeout=60
    )
    assert answer.status_code == 504, answer.text
    answer = httpx.post(
        gateway.url + f"/v2/models/{TINY_MODEL}/infer", json=tiny_request(), headers=auth
    )
    assert answer.status_code == 200, answer.text
    held.release()
    _wait(lambda: _pending(tiny_triton) == 0, "Triton's queue is empty")
    assert marker not in slow_executions(tiny_triton.repository)
