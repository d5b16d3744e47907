"""Which secrets the gateway agrees to serve with: no placeholder, no empty admin credential.

A copied template (``GATEWAY_ADMIN_TOKEN=change-me``) or a forgotten variable must stop the
gateway at start, not open it to whoever reads the template. :func:`secret_problems` lists what is
wrong with a :class:`~gateway.settings.GatewaySettings`; :func:`check_secrets` raises
:class:`InsecureSecrets` unless ``dev_insecure`` (``GATEWAY_DEV_INSECURE=1``) says the process is a
throwaway development server, in which case it only warns.

The rules:

- ``admin_token`` is required: at least :data:`MIN_TOKEN_CHARS` characters, no placeholder.
- ``jwt_secret`` (HS256) may be empty (HS256 bearer tokens are then off); when set it has at least
  :data:`MIN_JWT_SECRET_CHARS` characters (RFC 7518 3.2: a key as long as the hash, 256 bits) and
  is no placeholder.
- ``metrics_token`` and ``callback_secret`` may be empty (the feature is off); when set, the same
  rule as the admin token.

:func:`generate_secret` makes one that passes (what ``inferctl up`` and the tests use).
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

__all__ = [
    "DEV_INSECURE_ENV",
    "MIN_JWT_SECRET_CHARS",
    "MIN_TOKEN_CHARS",
    "InsecureSecrets",
    "check_secrets",
    "generate_secret",
    "is_placeholder",
    "secret_problems",
]

log = logging.getLogger(__name__)

#: the development switch (a GatewaySettings field, ``dev_insecure``)
DEV_INSECURE_ENV = "GATEWAY_DEV_INSECURE"
MIN_TOKEN_CHARS = 16
MIN_JWT_SECRET_CHARS = 32

# Compared after lower-casing and dropping everything but letters and digits, so "Change-Me",
# "change_me" and "<change me>" all match. A value *containing* one of the first group is a
# template's filler too ("change-me-in-production").
_PLACEHOLDER_PARTS = (
    "changeme",
    "replaceme",
    "placeholder",
    "fillmein",
    "yoursecret",
    "yourtoken",
    "insecure",
)
_PLACEHOLDER_WORDS = {
    "secret",
    "password",
    "passwd",
    "admin",
    "token",
    "default",
    "example",
    "test",
    "testing",
    "dev",
    "development",
    "todo",
    "fixme",
    "none",
    "null",
    "empty",
    "xxx",
    "12345678",
    "1234567890",
    "qwerty",
}


class InsecureSecrets(ValueError):
    """The settings carry a placeholder, weak or missing secret (the message names each one)."""


def is_placeholder(value: str) -> bool:
    """Whether ``value`` reads as a template's filler rather than a secret.

    Args:
        value: the secret as configured.

    Returns:
        True for ``change-me`` and its kin, a bare common word, or one character repeated.
    """
    folded = re.sub(r"[^a-z0-9]", "", value.lower())
    if not folded:
        return True
    return (
        any(part in folded for part in _PLACEHOLDER_PARTS)
        or folded in _PLACEHOLDER_WORDS
        or len(set(folded)) == 1
    )


def _problem(variable: str, value: str, *, required: bool, min_chars: int) -> str | None:
    if not value:
        return f"{variable} is empty (it is required)" if required else None
    if is_placeholder(value):
        return f"{variable} is a placeholder value; generate one, e.g. `openssl rand -hex 32`"
    if len(value) < min_chars:
        return f"{variable} has {len(value)} characters; at least {min_chars} are required"
    return None


def secret_problems(settings: GatewaySettings) -> list[str]:
    """Every secret of ``settings`` the gateway would refuse to serve with, one message each.

    Args:
        settings: the gateway's configuration.

    Returns:
        Messages naming the environment variable and what is wrong (never the value); empty: fine.
    """
    checks = [
        ("GATEWAY_ADMIN_TOKEN", settings.admin_token.get_secret_value(), True, MIN_TOKEN_CHARS),
        ("GATEWAY_JWT_SECRET", settings.jwt_secret.get_secret_value(), False, MIN_JWT_SECRET_CHARS),
        (
            "GATEWAY_METRICS_TOKEN",
            settings.metrics_token.get_secret_value(),
            False,
            MIN_TOKEN_CHARS,
        ),
        (
            "GATEWAY_CALLBACK_SECRET",
            settings.callback_secret.get_secret_value(),
            False,
            MIN_TOKEN_CHARS,
        ),
    ]
    problems = (
        _problem(name, value, required=required, min_chars=size)
        for name, value, required, size in checks
    )
    return [p for p in problems if p]


def check_secrets(settings: GatewaySettings) -> None:
    """Refuse to serve with the problems :func:`secret_problems` finds, unless ``dev_insecure``.

    Args:
        settings: the gateway's configuration.

    Raises:
        InsecureSecrets: a problem was found and ``settings.dev_insecure`` is off.
    """
    problems = secret_problems(settings)
    if not problems:
        return
    if settings.dev_insecure:
        log.warning(
            "%s=1: serving with insecure secrets (never do this outside development): %s",
            DEV_INSECURE_ENV,
            "; ".join(problems),
        )
        return
    raise InsecureSecrets(
        "refusing to start with insecure secrets: "
        + "; ".join(problems)
        + f". Set real ones (`inferctl up` generates them), or {DEV_INSECURE_ENV}=1 for a throwaway "
        "development server only"
    )


def generate_secret() -> str:
    """A fresh secret that passes every rule here: 32 random bytes, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)
