"""Unit tests of the per-key in-flight body bytes: the ledger and its middleware (fake ASGI apps;
the real gateway's behaviour is in test_gateway_inflight_bytes.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pytest

from gateway.app import ERROR_SHAPES, ERROR_STATUS
from gateway.errors import Overloaded, PayloadTooLarge
from gateway.http.body_bytes import InFlightBytesMiddleware
from gateway.http.problems import ProblemRenderer
from gateway.tenancy.context import CONTEXT_KEY, Principal, RequestContext
from gateway.tenancy.inflight_bytes import InFlightBytes

BOUND = 1000


def test_claims_add_up_per_key_and_give_back_what_they_took() -> None:
    ledger = InFlightBytes()
    first = ledger.claim("key:a", "free", BOUND, 1)
    second = ledger.claim("key:a", "free", BOUND, 1)
    other = ledger.claim("key:b", "free", BOUND, 1)
    first.cover(300)
    first.cover(600)  # grows by 300, not by 600
    first.cover(500)  # already held
    assert ledger.held("key:a") == 600
    second.cover(400)
    assert ledger.held("key:a") == BOUND
    other.cover(BOUND)  # another key's bound is its own
    with pytest.raises(Overloaded) as refused:
        ledger.claim("key:a", "free", BOUND, 3).cover(1)
    assert f"tier 'free' allows {BOUND} at once" in refused.value.detail
    assert refused.value.headers["Retry-After"] == "3"
    first.release()
    first.release()  # twice gives back nothing more
    assert ledger.held("key:a") == 400
    second.release()
    other.release()
    assert ledger.total() == 0 and ledger.held("key:a") == 0


def test_a_refused_growth_keeps_what_the_claim_held() -> None:
    ledger = InFlightBytes()
    holder = ledger.claim("key:a", "free", BOUND, 1)
    holder.cover(700)
    growing = ledger.claim("key:a", "free", BOUND, 1)
    growing.cover(200)
    with pytest.raises(Overloaded):
        growing.cover(400)  # 700 + 400 > 1000
    assert ledger.held("key:a") == 900 and growing.taken == 200
    growing.release()
    holder.release()
    assert ledger.total() == 0


def test_one_body_larger_than_the_bound_is_too_large_not_busy() -> None:
    ledger = InFlightBytes()
    with pytest.raises(PayloadTooLarge) as refused:
        ledger.claim("key:a", "free", BOUND, 1).cover(BOUND + 1)
    assert refused.value.field == "body"
    assert ledger.total() == 0


# -- the middleware, around fake apps --------------------------------------------------------------

Scope = MutableMapping[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]


def _scope(client: str | None, length: int | None = None) -> Scope:
    ctx = RequestContext(request_id="r")
    if client is not None:
        ctx.principal = Principal(client, frozenset({"*"}), "free", "api_key")
    headers = [(b"accept", b"application/problem+json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "path": "/v2/models/m/infer", "headers": headers, CONTEXT_KEY: ctx}


def _middleware(app: App, ledger: InFlightBytes) -> InFlightBytesMiddleware:
    return InFlightBytesMiddleware(
        app,
        ledger=ledger,
        bound=lambda tier: BOUND if tier == "free" else None,
        renderer=ProblemRenderer(ERROR_STATUS, ERROR_SHAPES),
        retry_after_s=2,
    )


def _chunks(*sizes: int) -> Callable[[], Awaitable[dict[str, Any]]]:
    messages = [
        {"type": "http.request", "body": b"x" * n, "more_body": i < len(sizes) - 1}
        for i, n in enumerate(sizes)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


async def _read_all_then_answer(scope: Scope, receive: Any, send: Any) -> None:
    try:
        while (await receive()).get("more_body", False):
            pass
    except Overloaded:
        # What a route does with a failed read: answer it (the middleware replaces the answer).
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"route's answer"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


class _Sent(list[MutableMapping[str, Any]]):
    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        self.append(message)

    @property
    def status(self) -> int:
        return int(self[0]["status"])

    def problem(self) -> dict[str, Any]:
        return json.loads(self[-1]["body"])  # type: ignore[no-any-return]


async def test_a_declared_length_that_does_not_fit_is_refused_before_the_app_runs() -> None:
    ledger = InFlightBytes()
    ledger.claim("key:a", "free", BOUND, 1).cover(600)
    ran = False

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        nonlocal ran
        ran = True

    sent = _Sent()
    await _middleware(app, ledger)(_scope("key:a", length=500), _chunks(500), sent)
    assert not ran and sent.status == 429
    assert (b"retry-after", b"2") in sent[0]["headers"]
    assert f"allows {BOUND} at once" in sent.problem()["detail"]
    assert ledger.held("key:a") == 600  # the refused request took nothing


async def test_a_streamed_body_is_counted_as_read_and_the_apps_answer_replaced() -> None:
    ledger = InFlightBytes()
    ledger.claim("key:a", "free", BOUND, 1).cover(600)
    sent = _Sent()
    await _middleware(_read_all_then_answer, ledger)(_scope("key:a"), _chunks(300, 300), sent)
    assert sent.status == 429 and len(sent) == 2
    assert "body of 600 bytes does not fit" in sent.problem()["detail"]
    assert ledger.held("key:a") == 600


async def test_the_bytes_are_given_back_before_the_answer_is_sent() -> None:
    ledger = InFlightBytes()
    held_when_answered: list[int] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        held_when_answered.append(ledger.held("key:a"))

    await _middleware(_read_all_then_answer, ledger)(
        _scope("key:a", length=800), _chunks(800), send
    )
    assert held_when_answered == [800, 0]  # held while answering, given back before the last part


async def test_the_bytes_are_given_back_when_the_app_fails() -> None:
    ledger = InFlightBytes()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        assert ledger.held("key:a") == 400
        raise RuntimeError("a server bug")

    with pytest.raises(RuntimeError):
        await _middleware(app, ledger)(_scope("key:a"), _chunks(400), _Sent())
    assert ledger.total() == 0


async def test_the_bytes_are_given_back_when_the_request_is_cancelled() -> None:
    ledger = InFlightBytes()
    reading = asyncio.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await receive()
        reading.set()
        await asyncio.Event().wait()  # serving until cancelled (a client that went away)

    task = asyncio.ensure_future(
        _middleware(app, ledger)(_scope("key:a", length=700), _chunks(700), _Sent())
    )
    await asyncio.wait_for(reading.wait(), 10)
    assert ledger.held("key:a") == 700
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ledger.total() == 0


async def test_unauthenticated_and_unbounded_requests_pass_untouched() -> None:
    ledger = InFlightBytes()
    for scope in (_scope(None, length=5000), _scope("key:a", length=5000)):
        if scope[CONTEXT_KEY].principal is not None:
            scope[CONTEXT_KEY].principal = Principal("key:a", frozenset(), "premium", "api_key")
        sent = _Sent()
        await _middleware(_read_all_then_answer, ledger)(scope, _chunks(5000), sent)
        assert sent.status == 200
    assert ledger.total() == 0
