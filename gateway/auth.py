"""Authentication: API keys (hashed, constant-time) or JWT bearer tokens, plus the admin credential.

Framework-free: takes header values, returns a :class:`gateway.context.Principal` or raises
:class:`gateway.errors.AuthenticationError` / :class:`gateway.errors.PermissionDenied`. Messages
never echo the credential.

Credentials are read from ``Authorization: Bearer <token>`` or ``X-API-Key: <key>``. A token that
looks like one of our keys (``gk_...``) is an API key; anything else is treated as a JWT.

Verified keys are cached for ``key_cache_ttl_s`` so the hot path does not touch SQLite. The cache
holds the stored hash, and every request is still compared against it; revoking or rotating through
this process's admin API drops the entry at once, other replicas see it within the TTL.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Mapping
from pathlib import Path

import jwt

from gateway.context import Principal
from gateway.errors import AuthenticationError, PermissionDenied
from gateway.keys import ApiKeyRecord, KeyStore, parse_key
from gateway.settings import GatewaySettings

__all__ = ["Authenticator", "extract_credential"]

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gateway"'}


def extract_credential(headers: Mapping[str, str]) -> str | None:
    """The bearer token or API key in ``headers`` (lower-case names), or ``None``."""
    api_key = headers.get("x-api-key")
    if api_key:
        return api_key.strip()
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def _load_public_key(value: str) -> str:
    if not value or value.lstrip().startswith("-----BEGIN"):
        return value
    return Path(value).read_text()


class Authenticator:
    """Turns request headers into a principal.

    Args:
        settings: JWT, admin and cache settings.
        store: the API key store.
    """

    def __init__(self, settings: GatewaySettings, store: KeyStore) -> None:
        self.settings = settings
        self.store = store
        self._cache: dict[str, tuple[float, ApiKeyRecord | None]] = {}
        self._jwt_keys: dict[str, str] = {}
        secret = settings.jwt_secret.get_secret_value()
        public = _load_public_key(settings.jwt_public_key)
        # Each algorithm family gets only its own key: an RSA public key must never be usable as
        # an HMAC secret (the classic algorithm-confusion attack).
        for alg in settings.jwt_algorithms:
            if alg.startswith("HS") and secret:
                self._jwt_keys[alg] = secret
            elif alg.startswith(("RS", "ES", "PS")) and public:
                self._jwt_keys[alg] = public

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The caller behind ``headers``.

        Args:
            headers: request headers with lower-case names.

        Returns:
            The authenticated principal.

        Raises:
            AuthenticationError: no credential, or one that is unknown, wrong, revoked or expired.
        """
        credential = extract_credential(headers)
        if credential is None:
            raise AuthenticationError(
                "missing credential: send 'Authorization: Bearer <api key or JWT>' or 'X-API-Key'",
                field="authorization",
                headers=_CHALLENGE,
            )
        if parse_key(credential) is not None:
            return await self._from_api_key(credential)
        admin = self.settings.admin_token.get_secret_value()
        if admin and hmac.compare_digest(credential.encode(), admin.encode()):
            # The admin credential may read client routes too (e.g. /v1/stats for operators).
            return Principal(
                client_id="admin", scopes=frozenset({"*"}), tier=self.settings.default_tier, kind="admin"
            )
        if credential.startswith("gk_"):
            raise AuthenticationError("malformed API key", field="authorization", headers=_CHALLENGE)
        return self._from_jwt(credential)

    async def _record(self, key_id: str) -> ApiKeyRecord | None:
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached is not None and now - cached[0] < self.settings.key_cache_ttl_s:
            return cached[1]
        # SQLite is blocking I/O: run it off the event loop (only on a cache miss).
        record = await asyncio.to_thread(self.store.get, key_id)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key_id] = (now, record)
        return record

    async def _from_api_key(self, credential: str) -> Principal:
        key_id = parse_key(credential)
        assert key_id is not None
        record = await self._record(key_id)
        if not KeyStore.matches(record, credential) or record is None:
            raise AuthenticationError("invalid API key", field="authorization", headers=_CHALLENGE)
        if record.revoked:
            raise AuthenticationError(
                "this API key has been revoked", field="authorization", headers=_CHALLENGE
            )
        return Principal(
            client_id=f"key:{record.key_id}",
            scopes=frozenset(record.scopes),
            tier=record.tier,
            kind="api_key",
        )

    def _from_jwt(self, token: str) -> Principal:
        if not self._jwt_keys:
            raise AuthenticationError(
                "invalid API key (JWT authentication is not configured)",
                field="authorization",
                headers=_CHALLENGE,
            )
        try:
            alg = jwt.get_unverified_header(token).get("alg", "")
            key = self._jwt_keys.get(alg)
            if key is None:
                raise AuthenticationError(
                    f"JWT algorithm {alg!r} is not accepted", field="authorization", headers=_CHALLENGE
                )
            require = (
                ["exp", "sub"]
                + (["iss"] if self.settings.jwt_issuer else [])
                + (["aud"] if self.settings.jwt_audience else [])
            )
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                issuer=self.settings.jwt_issuer or None,
                audience=self.settings.jwt_audience or None,
                options={"require": require},
                leeway=5,
            )
        except jwt.ExpiredSignatureError as exc:
            raise AuthenticationError("JWT has expired", field="authorization", headers=_CHALLENGE) from exc
        except jwt.PyJWTError as exc:
            # PyJWT's messages name the failing claim ("Invalid audience"), never the token.
            raise AuthenticationError(
                f"invalid JWT: {exc}", field="authorization", headers=_CHALLENGE
            ) from exc
        raw_scopes = claims.get("models", claims.get("scope", ""))
        scopes = raw_scopes.split() if isinstance(raw_scopes, str) else [str(s) for s in raw_scopes]
        tier = str(claims.get("tier") or self.settings.default_tier)
        return Principal(client_id=f"jwt:{claims['sub']}", scopes=frozenset(scopes), tier=tier, kind="jwt")

    def invalidate(self, key_id: str) -> None:
        """Forget a cached key (after a rotation or revocation in this process)."""
        self._cache.pop(key_id, None)

    def check_admin(self, headers: Mapping[str, str]) -> Principal:
        """Require the admin credential.

        Raises:
            PermissionDenied: the admin API is off (no ``GATEWAY_ADMIN_TOKEN``).
            AuthenticationError: the admin token is missing or wrong.
        """
        expected = self.settings.admin_token.get_secret_value()
        if not expected:
            raise PermissionDenied("the admin API is disabled: set GATEWAY_ADMIN_TOKEN to enable it")
        presented = headers.get("x-admin-token") or extract_credential(headers) or ""
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise AuthenticationError(
                "admin credential missing or wrong", field="authorization", headers=_CHALLENGE
            )
        return Principal(client_id="admin", scopes=frozenset({"*"}), tier="admin", kind="admin")
