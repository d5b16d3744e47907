"""Plain ASGI middleware, composed in one list by the app factory (outermost first):

1. :class:`ContextMiddleware`   request id, timing, RateLimit and Server-Timing headers, latency and
                                usage recording, access log
2. :class:`BodyLimitMiddleware` 413 on a too-large Content-Length, or as soon as a streamed body
                                passes the limit (the body is never read whole); the caller's
                                tier may have a lower cap (``TierLimit.max_body_bytes``), applied
                                from the first read of the body, before any parse
3. :class:`AuthMiddleware`      401/403 before any body is read (client, admin or metrics
                                credential by path); the principal goes on the context; 429 for a
                                key whose refused requests used up its tokens
                                (:class:`gateway.tenancy.refusals.RefusalCharge`, charged by 1.)
4. :class:`gateway.http.compression.DecompressionMiddleware`  gzip/deflate bodies decoded under the same
                                cap (413 past it), other codings 415

Errors raised here never reach FastAPI's handlers, so each middleware answers with the shared
:class:`gateway.http.problems.ProblemRenderer`, which uses the app's one status table.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, PayloadTooLarge
from gateway.http.problems import ProblemRenderer
from gateway.http.read_hold import PROTOCOL_SCOPE_KEY, answer_late, mark_hold
from gateway.observe.stats import LatencyTracker
from gateway.tenancy.auth import Authenticator, AuthRoutes
from gateway.tenancy.context import CONTEXT_KEY, RequestContext
from gateway.tenancy.refusals import RefusalCharge, RetryAfterWatch
from gateway.tenancy.usage import UsageMeter

__all__ = ["AuthMiddleware", "BodyLimitMiddleware", "ContextMiddleware", "DisconnectMiddleware"]


access_log = logging.getLogger("gateway.access")


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _header(scope: Scope, name: bytes) -> str | None:
    """The value :func:`_headers` would hold for ``name`` (lower case; the last one sent), without
    building the whole dict (the hot path wants one header here)."""
    value = None
    for key, raw in scope.get("headers", ()):
        if key.lower() == name:
            value = raw
    return None if value is None else value.decode("latin-1")


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class ContextMiddleware:
    """Creates the request's :class:`RequestContext` and turns it into headers and statistics.

    An authenticated request's answer carries a ``Server-Timing`` header with its stages
    (:mod:`gateway.observe.timing`) unless ``server_timing`` is off; anonymous callers never get one.

    Args:
        app: the next ASGI app.
        tracker: where admitted requests' latencies go.
        meter: where admitted requests' usage goes (per key, model and day).
        server_timing: whether to send the ``Server-Timing`` header.
        refusals: charges refused requests a token.
        retry_after: notes each 429 a key gets; a key that did not wait the last one out has its
            connection held (:mod:`gateway.http.read_hold`).
    """

    app: ASGIApp
    tracker: LatencyTracker
    meter: UsageMeter | None = None
    server_timing: bool = True
    refusals: RefusalCharge | None = None
    retry_after: RetryAfterWatch | None = None
    # Seeded from the system's randomness when the middleware is built, in its worker process.
    _ids: random.Random = field(default_factory=random.Random, init=False, repr=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # 16 random hex digits, as uuid4().hex[:16] gave, without a UUID or a system call per
        # request (an id names a request; it guards nothing).
        request_id = f"{self._ids.getrandbits(64):016x}"
        ctx = RequestContext(request_id=request_id)
        scope[CONTEXT_KEY] = ctx
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                if ctx.rate is not None and not any(
                    k.lower() == b"ratelimit-limit" for k, _ in headers
                ):
                    headers.extend(
                        (k.lower().encode(), v.encode()) for k, v in ctx.rate.headers().items()
                    )
                if self.server_timing and ctx.principal is not None:
                    total_s = time.perf_counter() - ctx.started
                    headers.append((b"server-timing", ctx.stages.header(total_s).encode()))
                principal = ctx.principal
                if status == 429 and self.retry_after and principal and principal.kind != "admin":
                    mark_hold(scope, principal.client_id, headers, self.retry_after.note)
                    if late_s := answer_late(scope, headers):
                        await asyncio.sleep(late_s)
                message["headers"] = headers
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                await send(message)
                self._finish(scope, ctx, status)
                # Only a 4xx that took no token is ever charged (RefusalCharge.charge): the answers
                # of the hot path skip the call.
                if self.refusals is not None and 400 <= status < 500 and not ctx.charged:
                    await self._charge(ctx, status)
                return
            await send(message)

        await self.app(scope, receive, send_wrapper)

    async def _charge(self, ctx: RequestContext, status: int) -> None:
        assert self.refusals is not None
        try:
            await self.refusals.charge(ctx, status)
        except GatewayError as exc:  # the limiter is down: the answer is sent, nothing to refuse
            access_log.debug("refused request of %s not charged: %s", ctx.request_id, exc)

    def _finish(self, scope: Scope, ctx: RequestContext, status: int) -> None:
        elapsed = time.perf_counter() - ctx.started
        client = ctx.principal.client_id if ctx.principal else "-"
        if ctx.admitted and ctx.model is not None:
            self.tracker.record(ctx.model, client, status, elapsed, ctx.stages.seconds)
            if self.meter is not None:
                self.meter.record(client, ctx.model, status, ctx.usage, ctx.stages.get("upstream"))
        if access_log.isEnabledFor(logging.INFO):
            # Only public ids here: never the Authorization header, a key or a token.
            access_log.info(
                "%s %s %s %d %.2fms client=%s model=%s",
                ctx.request_id,
                scope.get("method"),
                scope.get("path"),
                status,
                elapsed * 1000,
                client,
                ctx.model or "-",
            )


@dataclass(eq=False)
class BodyLimitMiddleware:
    """Refuses bodies over ``max_bytes`` without reading them whole.

    A declared ``Content-Length`` over the limit is answered at once. Otherwise the received chunks
    are counted; when they pass the limit the app's receive call raises, and whatever response the
    app then tries to send is replaced by the 413 problem.

    Args:
        app: the next ASGI app.
        max_bytes: the limit.
        renderer: the problem renderer.
    """

    app: ASGIApp
    max_bytes: int
    renderer: ProblemRenderer
    tier_max_bytes: Callable[[str], int | None] | None = None

    def _limit(self, ctx: RequestContext | None) -> tuple[int, str]:
        """The cap for this request: the caller's tier's once authentication has named it."""
        principal = ctx.principal if ctx is not None else None
        if principal is None or self.tier_max_bytes is None:
            return self.max_bytes, ""
        tier = self.tier_max_bytes(principal.tier)
        if tier is None or tier >= self.max_bytes:
            return self.max_bytes, ""
        return tier, f" of tier '{principal.tier}'"

    def _error(self, limit: tuple[int, str] | None = None) -> PayloadTooLarge:
        max_bytes, whose = limit or (self.max_bytes, "")
        return PayloadTooLarge(
            f"request body is larger than the limit{whose} of {max_bytes} bytes", field="body"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self.renderer.answer(scope, send, self._error())
            return
        received = 0
        tripped = False
        started = False
        ctx: RequestContext | None = scope.get(CONTEXT_KEY)
        limit: tuple[int, str] | None = None

        async def limited_receive() -> Message:
            nonlocal received, tripped, limit
            if limit is None:
                # The first read comes after authentication: the tier's cap is known, and a declared
                # length over it is refused before a byte of the body is taken.
                limit = self._limit(ctx)
                if declared is not None and declared.isdigit() and int(declared) > limit[0]:
                    tripped = True
                    raise self._error(limit)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit[0]:
                    tripped = True
                    raise self._error(limit)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if tripped:
                return  # the app's own answer to the failed read is replaced by our 413
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except PayloadTooLarge:
            if started and not tripped:
                raise
        if tripped:
            await self.renderer.answer(scope, send, self._error(limit))


class AuthMiddleware:
    """Authenticates protected paths before the app (and before any body is read).

    Args:
        app: the next ASGI app.
        authenticator: checks credentials.
        renderer: the problem renderer.
        routes: which paths are public, admin, metrics or signed.
        refusals: refuses (429) a key whose refused requests used up its tokens, before its body.
    """

    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator,
        renderer: ProblemRenderer,
        routes: AuthRoutes,
        refusals: RefusalCharge | None = None,
    ) -> None:
        self.app = app
        self.refusals = refusals
        self.authenticator = authenticator
        self.renderer = renderer
        # Copied onto the middleware: every request reads them, one attribute lookup each.
        self.public = routes.public
        self.public_prefixes = routes.public_prefixes
        self.admin_prefix = routes.admin_prefix
        self.metrics_paths = routes.metrics_paths
        self.signed_paths = routes.signed_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or path in self.public or path.startswith(self.public_prefixes):
            await self.app(scope, receive, send)
            return
        ctx: RequestContext | None = scope.get(CONTEXT_KEY)
        headers = _headers(scope)
        if (
            self.signed_paths is not None
            and self.signed_paths.fullmatch(path)
            and b"signature=" in scope.get("query_string", b"")
            and "authorization" not in headers
        ):
            await self.app(scope, receive, send)  # no principal: the route checks the signature
            return
        try:
            if path.startswith(self.admin_prefix):
                principal = self.authenticator.check_admin(headers)
            elif path in self.metrics_paths:
                principal = self.authenticator.check_metrics(headers)
            elif ctx is None:
                principal = await self.authenticator.authenticate(headers)
            else:
                with ctx.stages.stage("auth"):
                    principal = await self.authenticator.authenticate(headers)
        except GatewayError as exc:
            await self.renderer.answer(scope, send, exc)
            return
        if ctx is not None:
            ctx.principal = principal
        refused = self.refusals.refusal(principal) if self.refusals is not None else None
        if refused is not None:
            if ctx is not None:
                ctx.charged = True  # this 429 is the limit speaking
            await self.renderer.answer(scope, send, refused)
            return
        await self.app(scope, receive, send)


class DisconnectMiddleware:
    """Cancels the work of a request whose client went away before its answer.

    Without it the handler keeps waiting for Triton, holding its admission slots (the model's
    in-flight share and the key's concurrency) until Triton answers a client that is gone. Once the
    app has read the whole body, the connection is watched; a disconnect before the response has
    ended cancels the handler, which closes its request to Triton and releases its slots. Generation
    jobs run outside request handlers and are not touched.

    Args:
        app: the next ASGI app.
        methods: the methods watched (those that carry a body to work on).
    """

    def __init__(self, app: ASGIApp, methods: Iterable[str] = ("POST", "PUT")) -> None:
        self.app = app
        self.methods = frozenset(methods)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in self.methods:
            await self.app(scope, receive, send)
            return
        # The app runs in this task; when the client goes, this task is cancelled by the server's
        # protocol (a callback: gateway.http.limits) or, under another server, by a watcher task.
        task = asyncio.current_task()
        assert task is not None
        protocol = scope.get(PROTOCOL_SCOPE_KEY)
        watch = getattr(protocol, "watch_disconnect", None)
        unwatch = getattr(protocol, "unwatch_disconnect", None)
        watcher: asyncio.Task[None] | None = None
        watching = False
        answered = False
        gone = False

        def lost() -> None:
            nonlocal gone
            if not answered and not gone:
                gone = True
                task.cancel()

        async def wait_for_disconnect() -> None:
            # After the body, the server's receive() returns only when the client disconnects or the
            # response has ended; anything else is waited past.
            while (await receive())["type"] != "http.disconnect":
                pass
            lost()

        async def tracked_receive() -> Message:
            nonlocal watcher, watching
            message = await receive()
            if not watching and (
                message["type"] == "http.disconnect" or not message.get("more_body", False)
            ):
                watching = True
                if watch is not None:
                    watch(lost)
                else:
                    watcher = asyncio.ensure_future(wait_for_disconnect())
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            await self.app(scope, tracked_receive, tracked_send)
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:
                raise  # cancelled from outside (shutdown), not (only) by our watcher
            ctx: RequestContext | None = scope.get(CONTEXT_KEY)
            access_log.info(
                "%s client disconnected; its request is cancelled",
                ctx.request_id if ctx else "-",
            )
        else:
            if gone:
                task.uncancel()  # the app swallowed our cancellation; it must not outlive it
        finally:
            answered = True  # a callback already scheduled (the client left first) must not fire
            if watcher is not None:
                watcher.cancel()
            elif watching and unwatch is not None:
                unwatch(lost)
