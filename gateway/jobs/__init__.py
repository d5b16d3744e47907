"""Image generation as jobs: the job record and its stores (SQLite, Redis), the job API's models,
the workers that run jobs, completion callbacks, the short-lived image store and its signed URLs.

Each module is imported by its own name (``from gateway.jobs.<module> import ...``); this
package re-exports nothing, so importing one room costs only what that module needs.
"""

from __future__ import annotations

__all__ = [
    "callbacks",
    "image_store",
    "image_urls",
    "protocol",
    "runner",
    "service",
    "settings",
    "store",
    "store_redis",
    "store_sqlite",
]
