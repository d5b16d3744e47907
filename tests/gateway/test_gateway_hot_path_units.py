"""Unit tests of the hot path's leaner pieces: the disconnect watch that cancels the request's own
task, the cached Prometheus children and the plain stage timer (fakes for the ASGI server only;
the real server's disconnects are in test_gateway_cancel.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.middleware import DisconnectMiddleware
from gateway.observe.stats import LatencyTracker
from gateway.observe.timing import StageTimes

SCOPE: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v2/models/m/infer"}


class _Client:
    """The server's side of one request: the body, then a disconnect once ``leave`` is set."""

    def __init__(self) -> None:
        self.leave = asyncio.Event()
        self._body_sent = False

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        pass


async def test_a_client_that_leaves_cancels_the_app_and_the_request_ends_quietly() -> None:
    client, cancelled = _Client(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body: from now on the connection is watched
        client.leave.set()
        try:
            await asyncio.Event().wait()  # Triton that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(
        DisconnectMiddleware(app)(dict(SCOPE), client.receive, client.send)
    )
    await asyncio.wait_for(task, 10)
    assert cancelled.is_set()
    assert task.cancelling() == 0 and not task.cancelled()


async def test_a_cancellation_from_outside_is_not_taken_for_a_disconnect() -> None:
    client, started = _Client(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(
        DisconnectMiddleware(app)(dict(SCOPE), client.receive, client.send)
    )
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()  # e.g. the server shutting down: the client is still there
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_answered_request_is_not_cancelled_when_the_client_leaves_afterwards() -> None:
    client, finished = _Client(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})
        client.leave.set()
        for _ in range(5):  # the watcher sees the disconnect meanwhile, after the answer
            await asyncio.sleep(0)
        finished.set()  # what follows the answer (recording it) is not cut short

    task = asyncio.ensure_future(
        DisconnectMiddleware(app)(dict(SCOPE), client.receive, client.send)
    )
    await asyncio.wait_for(task, 10)
    assert finished.is_set() and task.cancelling() == 0


def test_labelled_children_are_the_ones_labels_gives() -> None:
    tracker = LatencyTracker()
    child = tracker.labelled(tracker.request_seconds, "m", "200")
    assert child is tracker.request_seconds.labels("m", "200")
    assert tracker.labelled(tracker.request_seconds, "m", "200") is child
    tracker.record("m", "key:a", 200, 0.01, {"upstream": 0.005})
    tracker.record("m", "key:a", 200, 0.01, {"upstream": 0.005})
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in tracker.registry.collect()
        for s in metric.samples
    }
    assert (
        samples[("gateway_request_duration_seconds_count", (("model", "m"), ("status", "200")))]
        == 2
    )
    assert (
        samples[("gateway_stage_duration_seconds_count", (("model", "m"), ("stage", "upstream")))]
        == 2
    )


def test_a_stage_is_timed_whether_its_block_returns_or_raises() -> None:
    stages = StageTimes()
    with stages.stage("parse"):
        pass
    with pytest.raises(ValueError), stages.stage("upstream"):
        raise ValueError("Triton said no")
    with stages.stage("parse"):
        pass
    assert set(stages.seconds) == {"parse", "upstream"}
    assert stages.get("upstream") >= 0.0 and stages.get("parse") >= 0.0
    assert stages.header(0.01).endswith("total;dur=10.000")
