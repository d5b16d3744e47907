"""Admission control: whether one request may reach Triton, decided before it costs anything.

The order is the contract (each step creates no state for a request a later step would refuse,
and nothing per model exists before the model is known):

1. the name's spelling (400): reserved Triton paths and names no model can have never go further;
2. the credential's scope (403): an out-of-scope caller learns nothing and drains no bucket;
3. the caller's limit across all models (429): one bucket per key, whatever names it sends;
4. the name is a model Triton serves (404), from the cached repository index
   (:mod:`gateway.backends.catalog`): only now may per-model state (buckets, counters, labels) be
   made for it;
5. the caller's limit for this model (429);
6. the reserve of the model's in-flight bound (``in_flight_reserve``, 503 + Retry-After): the last
   part of the bound is kept for the tiers of the highest priority; then the tier's share of the
   bound (429 + Retry-After): under overload the lower tiers, whose share is smaller, are shed first
   while the rest of the bound stays free for higher ones; then the key's own bound on requests in
   flight across models (``max_concurrent``, 429).
7. the model's circuit breaker (503 + Retry-After) while the model is being healed
   (:mod:`gateway.backends.model_healer`), which also hears how each admitted request ended.

Steps 3 and 5 are one call to the rate limiter (one Redis round trip), so the index of step 4 is
read before it; the answers still come in this order, and a model's bucket is only touched once
step 4 has passed.

A generation job (:mod:`gateway.jobs.runner`) passes steps 1-5 when it is submitted (:meth:`check`)
and takes step 6 only when a worker runs it (:meth:`slot`), with the job's own deadline.

Refused requests cost a token too (:mod:`gateway.tenancy.refusals`), so no key makes the gateway
parse for free.

An admitted request holds a :class:`Ticket`: the Triton model, the priority its tier maps to, and
its deadline, whose remainder travels to Triton as the request timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.backends.catalog import ModelCatalog, check_model_name
from gateway.backends.model_healer import ModelHealer
from gateway.errors import (
    CapacityReserved,
    ModelNotFound,
    ModelUnhealthy,
    Overloaded,
    PermissionDenied,
    RateLimited,
    UpstreamTimeout,
)
from gateway.observe.stats import LatencyTracker
from gateway.settings import GatewaySettings
from gateway.tenancy.context import RequestContext
from gateway.tenancy.ratelimit import Decision, RateLimiter
from gateway.tenancy.tiers import RateLimit

if TYPE_CHECKING:
    from gateway.backends.residency import ResidencyManager

__all__ = ["AdmissionControl", "Ticket", "key_bucket", "model_bucket"]


def key_bucket(client_id: str) -> str:
    """The rate-limit bucket of a client across every model (``*`` is no model name)."""
    return f"{client_id}:*"


def model_bucket(client_id: str, model: str) -> str:
    """The rate-limit bucket of a client for one model."""
    return f"{client_id}:{model}"


@dataclass(frozen=True)
class Ticket:
    """An admitted request.

    Attributes:
        model: the Triton model.
        priority: Triton's request priority for the caller's tier (1 is served first).
        deadline: ``time.monotonic()`` by which the answer must be back.
    """

    model: str
    priority: int
    deadline: float

    def remaining_s(self) -> float:
        """Seconds left before the deadline.

        Raises:
            UpstreamTimeout: the deadline has passed (the request is not sent at all).
        """
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise UpstreamTimeout(
                f"the request's deadline passed before it reached model '{self.model}'"
            )
        return left


def _tighter(a: Decision, b: Decision | None) -> Decision:
    return a if b is None or a.remaining <= b.remaining else b


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class AdmissionControl:
    """Admits requests in the order the module docstring gives, and counts them in flight.

    Args:
        settings: tiers, in-flight bound, deadline.
        catalog: the known model names.
        limiter: the rate limiter (in process or Redis).
        tracker: rejection counters and the in-flight gauge.
        healer: the per-model circuit breakers and their healing (``None``: none).
    """

    settings: GatewaySettings
    catalog: ModelCatalog
    limiter: RateLimiter
    tracker: LatencyTracker
    healer: ModelHealer | None = None

    def __post_init__(self) -> None:
        settings = self.settings
        self._in_flight: dict[str, int] = {}
        #: loads models on demand under a memory budget (:mod:`gateway.backends.residency`); ``None``: off
        self.residency: ResidencyManager | None = None
        self._key_in_flight: dict[str, int] = {}  # per client id; an entry exists only while > 0
        # The last ``in_flight_reserve`` of each model's bound is kept for the highest tier (the
        # tiers of the best priority), as Stripe's fleet load shedder keeps 20% for critical
        # traffic: other tiers are refused once the rest is in flight. The reserve is whole slots,
        # rounded down: a bound too small to spare one (4 at 20%) keeps none, rather than shutting
        # the lower tiers out whenever one top-tier request runs (a bound of 2 would reserve half).
        # The tiers are fixed for the app's life, so this is worked out once.
        self._top_priority = min(t.priority for t in settings.tier_limits.values())
        bound = settings.max_in_flight_per_model
        reserved = math.floor(bound * settings.in_flight_reserve + 1e-9)
        # None: no slot is kept back, so a full bound is the tier's share speaking (429), not a
        # reserve that does not exist (503).
        self._reserve_from: int | None = bound - reserved if reserved else None

    def in_flight(self, model: str) -> int:
        """Requests for ``model`` admitted and not yet answered."""
        return self._in_flight.get(model, 0)

    def check_scope(self, ctx: RequestContext, name: str, field: str = "model") -> str:
        """Steps 1-2 only (for metadata and readiness, which take no rate-limit token).

        Returns:
            The Triton model behind ``name`` (not yet checked to exist).
        """
        model = self.catalog.alias(check_model_name(name, field))
        principal = ctx.principal
        if principal is None:  # routes are behind the auth middleware; this is a wiring bug
            raise RuntimeError("admission without an authenticated principal")
        if not principal.allows(model):
            self.tracker.reject("scope")
            raise PermissionDenied(
                f"this credential is not allowed to use model '{name}'", field=field
            )
        return model

    async def known(self, name: str, model: str) -> None:
        """Step 4: refuse a model Triton does not serve (404 naming the name the client sent)."""
        if not await self._serves(model):
            raise self._unknown(name)

    async def _serves(self, model: str) -> bool:
        return model in await self.catalog.known(model)

    def _unknown(self, name: str) -> ModelNotFound:
        self.tracker.reject("unknown_model")
        return ModelNotFound(name)

    @asynccontextmanager
    async def admit(
        self, ctx: RequestContext, name: str, field: str = "model"
    ) -> AsyncIterator[Ticket]:
        """Let one request for ``name`` through, or refuse it before it reaches Triton (steps 1-6).

        Args:
            ctx: the request's context (``principal`` set by authentication).
            name: the model name the client sent (a Triton model or an alias).
            field: the request field that carried it, for errors.

        Yields:
            The request's :class:`Ticket`; its in-flight slot is held until the block exits.

        Raises:
            BadRequest: the name cannot be a model name.
            PermissionDenied: the caller's scopes do not include the model.
            RateLimited: the caller's bucket across all models, or for this model, is empty.
            ModelNotFound: Triton does not serve the model.
            Overloaded: the tier's share of the model's in-flight bound is taken.
            RateLimiterUnavailable: Redis is down and the policy is closed.
        """
        model = await self.check(ctx, name, field)
        async with self.slot(ctx, model) as ticket:
            yield ticket

    async def check(self, ctx: RequestContext, name: str, field: str = "model") -> str:
        """Steps 1-5: name, scope, the caller's rate limits and that Triton serves the model.

        A generation job passes these when it is submitted and takes its in-flight slot
        (:meth:`slot`) only when a worker runs it.

        Returns:
            The Triton model behind ``name``.

        Raises:
            See :meth:`admit` (all but ``Overloaded``).
        """
        with ctx.stages.stage("admit"):
            return await self._check(ctx, name, field)

    async def _check(self, ctx: RequestContext, name: str, field: str) -> str:
        model = self.check_scope(ctx, name, field)
        principal = ctx.principal
        assert principal is not None
        tier = self.settings.tier_limit(principal.tier)
        # Both buckets in one limiter call (one Redis round trip); the model's is only touched for a
        # model Triton serves, and only once the caller's bucket across all models has admitted.
        served = await self._serves(model)
        key_limit, model_limit = tier.key_limit(), tier.model_limit() if served else None
        checks = [(key_bucket(principal.client_id), key_limit)] if key_limit is not None else []
        if model_limit is not None:
            checks.append((model_bucket(principal.client_id, model), model_limit))
        decisions = await self.limiter.hit_all(checks) if checks else []
        ctx.charged = bool(checks)
        key_decision = decisions[0] if key_limit is not None else None
        if key_limit is not None and not decisions[0].allowed:
            ctx.rate = decisions[0]
            raise self._rate_limited("across all models", principal.tier, key_limit, decisions[0])
        if not served:
            raise self._unknown(name)
        if model_limit is None:
            ctx.rate = key_decision  # None for an unlimited tier: no RateLimit headers
            return model
        decision = decisions[-1]
        ctx.rate = _tighter(decision, key_decision)
        if not decision.allowed:
            raise self._rate_limited(f"for model '{model}'", principal.tier, model_limit, decision)
        return model

    def _rate_limited(
        self, scope: str, tier: str, limit: RateLimit, decision: Decision
    ) -> RateLimited:
        """The 429 of a bucket that refused (``scope`` says what it counts), counted as rejected."""
        self.tracker.reject("rate_limit")
        return RateLimited(
            f"rate limit {scope} exceeded (tier '{tier}': "
            f"{limit.per_minute:g}/min, burst {limit.burst})",
            retry_after_s=decision.retry_after_s,
            headers=decision.headers(),
        )

    @asynccontextmanager
    async def slot(
        self, ctx: RequestContext, model: str, timeout_s: float | None = None
    ) -> AsyncIterator[Ticket]:
        """Step 6: the tier's share of ``model``'s in-flight bound, held until the block exits.

        A tier below the highest priority is refused first when only the reserve of the bound
        (``in_flight_reserve``) is left (503), else when its own share is taken (429).

        Args:
            ctx: the request's context (its principal's tier sets the share and the priority).
            model: a Triton model that passed :meth:`check`.
            timeout_s: the deadline from now (default ``upstream_timeout_s``; jobs have their own).

        Raises:
            CapacityReserved: a tier below the highest found only the reserve left.
            Overloaded: the tier's share is taken.
            ModelUnhealthy: the model's circuit breaker is open (it is being reloaded).
        """
        principal = ctx.principal
        if principal is None:
            raise RuntimeError("admission without an authenticated principal")
        if self.healer is not None:
            try:
                self.healer.check(model)
            except ModelUnhealthy:
                self.tracker.reject("breaker_open")
                raise
        tier = self.settings.tier_limit(principal.tier)
        bound = self.settings.max_in_flight_per_model
        share = max(1, math.floor(bound * tier.in_flight_share + 1e-9))
        running = self._in_flight.get(model, 0)
        if (
            self._reserve_from is not None
            and running >= self._reserve_from
            and tier.priority > self._top_priority
        ):
            # 503, not the share's 429: the model as a whole is near its capacity (Stripe's load
            # shedder answers the same), whatever is left of this tier's own share.
            self.tracker.reject("reserve")
            raise CapacityReserved(
                f"model '{model}' has {running} requests in flight; the rest of its capacity is kept "
                f"for the highest tier (tier '{principal.tier}' may use {self._reserve_from} of {bound}); "
                "retry shortly",
                retry_after_s=self.settings.retry_after_s,
            )
        if running >= share:
            # 429 rather than 503: load shedding the client should back off from, not an outage.
            self.tracker.reject("in_flight")
            held = (
                "" if share == bound else f" (tier '{principal.tier}' may use {share} of {bound})"
            )
            raise Overloaded(
                f"model '{model}' already has {running} requests in flight{held}; retry shortly",
                retry_after_s=self.settings.retry_after_s,
            )
        client = principal.client_id
        mine = self._key_in_flight.get(client, 0)
        if tier.max_concurrent is not None and mine >= tier.max_concurrent:
            self.tracker.reject("concurrency")
            raise Overloaded(
                f"this key already has {mine} requests in flight (tier '{principal.tier}' allows "
                f"{tier.max_concurrent} at once); retry when one has been answered",
                retry_after_s=self.settings.retry_after_s,
            )
        self._key_in_flight[client] = mine + 1
        self._in_flight[model] = running + 1
        self.tracker.labelled(self.tracker.in_flight, model).inc()
        ctx.model = model
        ctx.admitted = True
        ticket = Ticket(
            model=model,
            priority=tier.priority,
            deadline=time.monotonic()
            + (self.settings.upstream_timeout_s if timeout_s is None else timeout_s),
        )
        try:
            if self.residency is None:
                yield ticket
            else:
                # Loaded on demand (within this request's deadline) and kept from eviction while it runs.
                if not self.residency.loaded(model):
                    with ctx.stages.stage("load"):
                        await self.residency.ensure(model, ticket.deadline)
                async with self.residency.hold(model, ticket.deadline):
                    yield ticket
        except BaseException as exc:
            if self.healer is not None:
                self.healer.observe(model, exc)
            raise
        else:
            if self.healer is not None:
                self.healer.observe(model, None)
        finally:
            self._in_flight[model] -= 1
            left = self._key_in_flight[client] - 1
            if left:
                self._key_in_flight[client] = left
            else:
                del self._key_in_flight[client]
            self.tracker.labelled(self.tracker.in_flight, model).dec()
