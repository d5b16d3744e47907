"""Image generation as jobs: the job record and its stores (SQLite, Redis), the job API's models,
the workers that run jobs, completion callbacks, the short-lived image store and its signed URLs.
"""

from __future__ import annotations

# its modules, each imported by name: nothing is re-exported
__all__ = [
    "callback_policy",
    "callback_sender",
    "callback_signature",
    "image_store",
    "image_urls",
    "protocol",
    "redis_calls",
    "runner",
    "service",
    "settings",
    "store",
    "store_redis",
    "store_redis_scripts",
    "store_sqlite",
]
