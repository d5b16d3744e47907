"""Job callbacks' signature: how a callback is signed, and how a receiver checks it.

**Signature** (as Stripe's and GitHub's webhooks do it), header ``Gateway-Signature``::

    Gateway-Signature: t=1767225600,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd

``v1`` is the lowercase hex HMAC-SHA256, keyed with ``GATEWAY_CALLBACK_SECRET``, of the timestamp,
a period and the raw body: ``f"{t}.".encode() + body``. A receiver recomputes it over the bytes it
received, compares in constant time and refuses timestamps older than a few minutes (replays);
:func:`verify` does exactly that. ``Gateway-Job-Id`` names the job: a callback can arrive more than
once (a delivery whose answer was lost is retried), so receivers should act on a job id once.
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["JOB_ID_HEADER", "SIGNATURE_HEADER", "sign", "verify"]

SIGNATURE_HEADER = "Gateway-Signature"
JOB_ID_HEADER = "Gateway-Job-Id"


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The ``Gateway-Signature`` header value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(
    secret: bytes, header: str, body: bytes, *, tolerance_s: float = 300, now: float | None = None
) -> bool:
    """Whether ``header`` (a ``Gateway-Signature`` value) signs ``body`` with ``secret``, recently.

    What a receiver runs on the raw body it received, before parsing it.
    """
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    # Bytes: compare_digest raises on a str holding anything but ASCII, and a header can hold other bytes.
    return hmac.compare_digest(
        expected.encode(), parts.get("v1", "").encode("utf-8", "surrogateescape")
    )
