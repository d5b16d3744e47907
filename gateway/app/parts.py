"""What the app is built from before it starts (no I/O beyond opening the key store), shared by the
middleware, the routes (through ``app.state``) and the lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.app.error_handlers import ERROR_SHAPES, ERROR_STATUS
from gateway.http.problems import ProblemRenderer
from gateway.jobs.callback_policy import CallbackPolicy
from gateway.observe.stats import LatencyTracker
from gateway.settings import GatewaySettings
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.key_stores import open_key_store
from gateway.tenancy.keys import KeyStore
from gateway.tenancy.state_sync import StateSync
from gateway.tenancy.traffic import TrafficSplit
from gateway.tenancy.usage import UsageMeter
from serving.limits import DEFAULT_LIMITS

__all__ = ["AppParts", "build_parts"]


@dataclass
class AppParts:
    """What the app is built from before it starts: shared by the middleware, the routes (through
    ``app.state``) and the lifespan."""

    renderer: ProblemRenderer
    tracker: LatencyTracker
    meter: UsageMeter
    key_store: KeyStore
    redis_client: Any
    traffic: TrafficSplit
    authenticator: Authenticator
    sync: StateSync | None
    callbacks: CallbackPolicy


def build_parts(settings: GatewaySettings) -> AppParts:
    """The app's long-lived parts, built before it starts (no I/O beyond opening the key store)."""
    tracker = LatencyTracker(
        settings.stats_window_s,
        settings.stats_bucket_s,
        settings.stats_max_series,
        settings.max_client_labels,
    )
    # With Redis, keys and canary weights live there (every replica and worker sees one truth);
    # without it, keys are the SQLite file and weights stay in this single process.
    store = open_key_store(settings)
    redis_client = None
    if settings.shared:
        from gateway.tenancy.redis_state import RedisTrafficStore, connect, read_versions

        redis_client = connect(settings.redis_url.get_secret_value(), settings.redis_timeout_s)
        traffic = TrafficSplit(store=RedisTrafficStore(redis_client, settings.redis_prefix))
    else:
        traffic = TrafficSplit()
    authenticator = Authenticator(settings, store)
    sync = None
    if redis_client is not None:
        client = redis_client
        sync = StateSync(
            lambda: read_versions(client, settings.redis_prefix),
            authenticator.clear,
            traffic,
            settings.state_sync_interval_s,
        )
    callbacks = CallbackPolicy(
        settings.callback_allow,
        settings.callback_private_networks,
        max_url_chars=DEFAULT_LIMITS.jobs.max_callback_url_chars,
        resolve_timeout_s=settings.callback_timeout_s,
    )
    return AppParts(
        ProblemRenderer(ERROR_STATUS, ERROR_SHAPES),
        tracker,
        UsageMeter(),
        store,
        redis_client,
        traffic,
        authenticator,
        sync,
        callbacks,
    )
