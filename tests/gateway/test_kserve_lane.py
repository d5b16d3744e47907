"""The KServe inference path as plain ASGI (gateway.routes.kserve_lane.InferLane), unit-tested with a
fake service: what reaches the service, what the client gets back, and what goes on to the framework.
The integration tests of /v2 (test_gateway_kserve*.py) run it against the real Triton."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from gateway import errors
from gateway.app import ERROR_SHAPES, ERROR_STATUS
from gateway.backends.triton import RawResponse
from gateway.http.problems import ProblemRenderer
from gateway.routes.kserve_lane import InferLane
from gateway.tenancy.context import CONTEXT_KEY, RequestContext


class FakeService:
    def __init__(self, outcome: RawResponse | Exception) -> None:
        self.outcome = outcome
        self.calls: list[dict[str, Any]] = []

    async def infer_v2(self, ctx, model, body, *, version="", accept_encoding="identity"):  # type: ignore[no-untyped-def]
        self.calls.append(
            {
                "model": model,
                "body": body.body,
                "header_length": body.header_length,
                "accept_encoding": accept_encoding,
            }
        )
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


async def _call(
    service: FakeService,
    path: str = "/v2/models/m/infer",
    method: str = "POST",
    chunks: tuple[bytes, ...] = (b"{}",),
    headers: tuple[tuple[bytes, bytes], ...] = (),
    disconnect: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages the lane sent, and the paths that went on to the next app."""
    sent: list[dict[str, Any]] = []
    onwards: list[str] = []
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1 or disconnect}
        for i, chunk in enumerate(chunks)
    ]
    if disconnect:
        messages.append({"type": "http.disconnect"})

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def framework(scope: dict[str, Any], receive: Any, send: Any) -> None:
        onwards.append(scope["path"])

    lane = InferLane(framework, ProblemRenderer(ERROR_STATUS, ERROR_SHAPES))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": list(headers),
        "app": SimpleNamespace(state=SimpleNamespace(service=service)),
        CONTEXT_KEY: RequestContext(request_id="r1"),
    }
    await lane(scope, receive, send)
    return sent, onwards


async def test_the_body_and_headers_reach_the_service_and_the_answer_the_client() -> None:
    service = FakeService(RawResponse(b'{"outputs":[]}', {"Content-Type": "application/json"}))
    sent, onwards = await _call(
        service,
        chunks=(b'{"inp', b'uts":[]}'),
        headers=((b"Inference-Header-Content-Length", b"12"), (b"Accept-Encoding", b"br, gzip")),
    )
    assert onwards == []
    assert service.calls == [
        {"model": "m", "body": b'{"inputs":[]}', "header_length": "12", "accept_encoding": "gzip"}
    ]
    assert sent[0]["status"] == 200
    assert dict(sent[0]["headers"]) == {
        b"content-type": b"application/json",
        b"content-length": b"14",
    }
    assert sent[1] == {"type": "http.response.body", "body": b'{"outputs":[]}'}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/models/m/infer"),
        ("POST", "/v2/models/m/versions/1/infer"),
        ("POST", "/v2/models/m/infer/"),
    ],
)
async def test_other_methods_and_paths_go_on_to_the_framework(method: str, path: str) -> None:
    service = FakeService(RawResponse(b"", {}))
    sent, onwards = await _call(service, path=path, method=method)
    assert (sent, onwards, service.calls) == ([], [path], [])


async def test_a_gateway_error_answers_in_kserve_shape() -> None:
    sent, _ = await _call(FakeService(errors.ModelNotFound("nope", "model 'nope' is not served")))
    assert sent[0]["status"] == 404
    assert json.loads(sent[1]["body"]) == {"error": "model 'nope' is not served"}


async def test_an_unexpected_error_is_a_logged_500(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="gateway.app"):
        sent, _ = await _call(FakeService(RuntimeError("boom")))
    assert sent[0]["status"] == 500
    assert "boom" not in sent[1]["body"].decode()
    assert "the gateway failed" in json.loads(sent[1]["body"])["error"]
    assert "boom" in caplog.text  # the traceback is in the log


async def test_a_client_gone_while_sending_gets_no_answer_and_costs_no_call() -> None:
    service = FakeService(RawResponse(b"", {}))
    sent, _ = await _call(service, chunks=(b'{"inp',), disconnect=True)
    assert (sent, service.calls) == ([], [])
