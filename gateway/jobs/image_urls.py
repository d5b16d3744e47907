"""Signed, expiring image URLs: ``/v1/images/files/{token}?expires=E&signature=S``.

A ``url`` answer of ``/v1/images/generations`` must open in a browser, an ``<img>`` tag or the
OpenAI clients' own download, none of which send the API key. So the URL carries its own proof:
``S = base64url(HMAC-SHA256(K, path + "\\n" + E))`` over the path and the expiry ``E`` (Unix
seconds). Changing either (another token, a later expiry) breaks the signature: 403. A URL whose
signature holds but whose time has passed: 410.

The key ``K`` is derived, with a fixed context string, from a secret the gateway already has (the
admin token, else the JWT secret), so nothing new needs provisioning and every replica and worker
configured alike verifies every other's URLs; a derived key also means the admin token itself
never signs anything a client sees. With neither secret set, each process draws a random key:
URLs then verify only in the process that made them (the single-process default). Rotating the
secret invalidates the URLs out (they live minutes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import Gone, PermissionDenied

__all__ = ["KEY_CONTEXT", "ImageUrlSigner", "SignedUrl"]

#: the context the URL key is derived under: a key derived for anything else never verifies here
KEY_CONTEXT = b"inference-gateway/image-url/v1"


def _digest(key: bytes, path: str, expires: int) -> str:
    mac = hmac.new(key, f"{path}\n{expires}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class SignedUrl:
    """A signed path and when it stops opening (Unix seconds)."""

    path: str
    expires: int
    signature: str

    def relative(self) -> str:
        return f"{self.path}?expires={self.expires}&signature={self.signature}"


class ImageUrlSigner:
    """Signs and checks image URLs.

    Args:
        secret: the gateway secret the key is derived from; empty: a random key for this process.
        clock: wall-clock seconds (URLs are checked by other processes and hosts).
    """

    def __init__(self, secret: str, clock: Callable[[], float] = time.time) -> None:
        root = secret.encode() if secret else secrets.token_bytes(32)
        self._key = hmac.new(root, KEY_CONTEXT, hashlib.sha256).digest()
        self._clock = clock
        self.process_local = not secret

    def sign(self, path: str, ttl_s: float) -> SignedUrl:
        """``path`` signed to open for ``ttl_s`` seconds from now (rounded down to whole seconds)."""
        expires = int(self._clock() + ttl_s)
        return SignedUrl(path, expires, _digest(self._key, path, expires))

    def remaining_s(self, expires: int) -> int:
        """Whole seconds an URL expiring at ``expires`` still opens (for ``Cache-Control``)."""
        return max(0, math.floor(expires - self._clock()))

    def check(self, path: str, expires: str | None, signature: str | None) -> int:
        """Check a signed URL's query; returns its expiry.

        Raises:
            PermissionDenied: no signature, or one that does not match the path and expiry (403).
            Gone: the signature holds but the URL has expired (410).
        """
        if not expires or not signature:
            raise PermissionDenied(
                "this image URL is not signed: use the URL the generation answered, with its "
                "expires and signature",
                field="signature",
            )
        if (
            not (expires.isascii() and expires.isdigit()) or len(expires) > 12
        ):  # int() reads any script's digits
            raise PermissionDenied("this image URL's expires is not a Unix time", field="expires")
        when = int(expires)
        # Bytes: compare_digest raises on a str holding anything but ASCII, and a query can hold anything.
        if not hmac.compare_digest(_digest(self._key, path, when).encode(), signature.encode()):
            raise PermissionDenied(
                "this image URL's signature does not match its path and expiry (altered, or "
                "signed by another gateway)",
                field="signature",
            )
        if when <= self._clock():
            raise Gone("this image URL has expired; generate the image again", field="expires")
        return when
