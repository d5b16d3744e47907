"""Who is asking and what they may spend: the per-request context (the caller, its rate, its
usage), API keys and their stores, authentication, tiers, rate limits, usage metering, admission
control, per-model canary weights, the secrets the gateway agrees to serve with and the owner-only
files of tenants' data.
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = [
    "admission",
    "auth",
    "context",
    "inflight_bytes",
    "key_protocol",
    "key_stores",
    "keys",
    "keys_cli",
    "keys_sqlite",
    "private_files",
    "ratelimit",
    "ratelimit_lease",
    "redis_state",
    "refusals",
    "secret_policy",
    "settings",
    "state_sync",
    "tiers",
    "traffic",
    "usage",
    "usage_store",
]
