"""Authentication: API keys (hashed, constant-time) or JWT bearer tokens, plus the admin credential.

Framework-free: takes header values, returns a :class:`gateway.tenancy.context.Principal` or raises
:class:`gateway.errors.AuthenticationError` / :class:`gateway.errors.PermissionDenied`. Messages
never echo the credential.

Credentials are read from ``Authorization: Bearer <token>`` or ``X-API-Key: <key>``. A token that
looks like one of our keys (``gk_...``) is an API key; anything else is treated as a JWT.

Looked-up keys are cached for at most ``key_cache_ttl_s`` so the hot path does not touch the store.
The cache holds the stored hash, and every request is still compared against it. A key in use is
looked up again in the background once 80% of that time has passed, and requests that miss the
cache together share one lookup, so a busy key's requests never queue for the store. Revoking or
rotating through this process's admin API drops the entry at once; with a shared store (Redis),
:class:`gateway.tenancy.state_sync.StateSync` empties the cache whenever any replica changed a key, so other
replicas and workers follow within ``state_sync_interval_s``. While the store cannot be reached, the
``open`` failure policy keeps honouring keys this process has already looked up (past their TTL);
``closed`` refuses with 503 once they expire.

An id the store does not know costs what a known one with a wrong secret costs (one hash, one
constant-time comparison against a dummy hash), gets the same answer, and is cached apart from the
known ids, so made-up ids never push real keys out of the cache.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt

from gateway.errors import AuthenticationError, PermissionDenied, StateStoreUnavailable
from gateway.settings import GatewaySettings
from gateway.tenancy.context import Principal
from gateway.tenancy.keys import ApiKeyRecord, KeyStore, KeyStoreUnavailable, parse_key
from gateway.tenancy.settings import RedisFailurePolicy

__all__ = ["AuthRoutes", "Authenticator", "extract_credential"]

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="gateway"'}
#: entries each key cache (known ids, unknown ids) holds before it is emptied
_CACHE_ENTRIES = 10_000
#: share of ``key_cache_ttl_s`` after which a key in use is looked up again in the background
_REFRESH_AT = 0.8


@dataclass(frozen=True)
class AuthRoutes:
    """Which credential each path needs: the app's route classes as one value, so the app factory
    states them in one place and :class:`gateway.http.middleware.AuthMiddleware` takes them as one
    argument.

    Attributes:
        public: exact paths anyone may call (health, docs).
        public_prefixes: path prefixes anyone may call.
        admin_prefix: paths that need the admin credential instead of a client one.
        metrics_paths: exact paths that need the metrics (or admin) credential.
        signed_paths: paths that, with a ``signature`` in the query and no ``Authorization``, pass
            without a credential: their route checks the signature (signed image URLs).
    """

    public: frozenset[str]
    public_prefixes: tuple[str, ...] = ()
    admin_prefix: str = "/admin/"
    metrics_paths: frozenset[str] = frozenset()
    signed_paths: re.Pattern[str] | None = None


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
        clock: monotonic seconds, for the cache's ages (tests pass their own).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        store: KeyStore,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.store = store
        self._clock = clock
        self._cache: dict[str, tuple[float, ApiKeyRecord | None]] = {}
        # Ids the store does not know, apart: a client spraying made-up ids fills (and empties) only
        # this one, never pushing real keys out of the cache above onto the store.
        self._unknown: dict[str, tuple[float, ApiKeyRecord | None]] = {}
        # Bumped by every invalidation: a lookup that started before one must not cache its
        # (possibly stale) answer after it.
        self._generation = 0
        self._lookups: dict[str, asyncio.Task[ApiKeyRecord | None]] = {}
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
                client_id="admin",
                scopes=frozenset({"*"}),
                tier=self.settings.default_tier,
                kind="admin",
            )
        if credential.startswith("gk_"):
            raise AuthenticationError(
                "malformed API key", field="authorization", headers=_CHALLENGE
            )
        return self._from_jwt(credential)

    async def _record(self, key_id: str) -> ApiKeyRecord | None:
        cached = self._cache.get(key_id) or self._unknown.get(key_id)
        ttl = self.settings.key_cache_ttl_s
        age = self._clock() - cached[0] if cached is not None else ttl
        if cached is not None and age < ttl:
            if age >= ttl * _REFRESH_AT:
                # A key in use is looked up again before it expires, while the cache still answers:
                # its requests never wait for the store (nor all at once when it expires).
                self._lookup(key_id)
            return cached[1]
        try:
            # Shielded: a request that goes away must not cancel the lookup others share.
            return await asyncio.shield(self._lookup(key_id))
        except KeyStoreUnavailable as exc:
            if cached is not None and self.settings.redis_failure_policy is RedisFailurePolicy.OPEN:
                # Availability first: the last answer the store gave stands until it is back (no
                # change can be written to an unreachable store either).
                return cached[1]
            raise StateStoreUnavailable(
                f"API keys cannot be verified: {exc}", retry_after_s=1
            ) from exc

    def _lookup(self, key_id: str) -> asyncio.Task[ApiKeyRecord | None]:
        """The store lookup of ``key_id`` in flight, started if there is none: requests that miss the
        cache together share one lookup instead of each queueing one on the thread pool."""
        task = self._lookups.get(key_id)
        if task is None:
            task = asyncio.create_task(self._fetch(key_id))
            self._lookups[key_id] = task
            task.add_done_callback(lambda done: self._lookup_done(key_id, done))
        return task

    def _lookup_done(self, key_id: str, task: asyncio.Task[ApiKeyRecord | None]) -> None:
        if self._lookups.get(key_id) is task:
            del self._lookups[key_id]
        if not task.cancelled():
            task.exception()  # retrieved: a failed refresh nobody awaited is not an "unretrieved" error

    async def _fetch(self, key_id: str) -> ApiKeyRecord | None:
        started, generation = self._clock(), self._generation
        # The store is blocking I/O: run it off the event loop (only on a cache miss or a refresh).
        record = await asyncio.to_thread(self.store.get, key_id)
        if generation == self._generation:
            cache = self._cache if record is not None else self._unknown
            if len(cache) > _CACHE_ENTRIES:
                cache.clear()
            (self._unknown if record is not None else self._cache).pop(key_id, None)
            cache[key_id] = (started, record)
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
                    f"JWT algorithm {alg!r} is not accepted",
                    field="authorization",
                    headers=_CHALLENGE,
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
            raise AuthenticationError(
                "JWT has expired", field="authorization", headers=_CHALLENGE
            ) from exc
        except jwt.PyJWTError as exc:
            # PyJWT's messages name the failing claim ("Invalid audience"), never the token.
            raise AuthenticationError(
                f"invalid JWT: {exc}", field="authorization", headers=_CHALLENGE
            ) from exc
        raw_scopes = claims.get("models", claims.get("scope", ""))
        scopes = raw_scopes.split() if isinstance(raw_scopes, str) else [str(s) for s in raw_scopes]
        tier = str(claims.get("tier") or self.settings.default_tier)
        return Principal(
            client_id=f"jwt:{claims['sub']}", scopes=frozenset(scopes), tier=tier, kind="jwt"
        )

    def invalidate(self, key_id: str) -> None:
        """Forget a cached key (after a rotation or revocation in this process); a lookup already
        under way answers only the requests that were waiting for it."""
        self._generation += 1
        self._cache.pop(key_id, None)
        self._unknown.pop(key_id, None)
        self._lookups.pop(key_id, None)

    def clear(self) -> None:
        """Forget every cached key (another replica changed some)."""
        self._generation += 1
        self._cache.clear()
        self._unknown.clear()
        self._lookups.clear()

    def check_admin(self, headers: Mapping[str, str]) -> Principal:
        """Require the admin credential.

        Raises:
            PermissionDenied: the admin API is off (no ``GATEWAY_ADMIN_TOKEN``).
            AuthenticationError: the admin token is missing or wrong.
        """
        expected = self.settings.admin_token.get_secret_value()
        if not expected:
            raise PermissionDenied(
                "the admin API is disabled: set GATEWAY_ADMIN_TOKEN to enable it"
            )
        presented = headers.get("x-admin-token") or extract_credential(headers) or ""
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise AuthenticationError(
                "admin credential missing or wrong", field="authorization", headers=_CHALLENGE
            )
        return Principal(client_id="admin", scopes=frozenset({"*"}), tier="admin", kind="admin")

    def check_metrics(self, headers: Mapping[str, str]) -> Principal:
        """Require the metrics credential (``GATEWAY_METRICS_TOKEN``) or the admin one, for ``/metrics``.

        Metrics name every model and (capped) client, so they are not public; Prometheus presents
        the metrics token as a bearer token and needs no admin rights.

        Raises:
            PermissionDenied: neither a metrics nor an admin token is configured.
            AuthenticationError: the credential is missing or wrong.
        """
        accepted = [
            token.get_secret_value().encode()
            for token in (self.settings.metrics_token, self.settings.admin_token)
            if token.get_secret_value()
        ]
        if not accepted:
            raise PermissionDenied("/metrics is disabled: set GATEWAY_METRICS_TOKEN to enable it")
        presented = (extract_credential(headers) or headers.get("x-admin-token") or "").encode()
        # Compare against every accepted token (no early exit), in constant time each.
        if not sum(hmac.compare_digest(presented, token) for token in accepted):
            raise AuthenticationError(
                "metrics credential missing or wrong: send 'Authorization: Bearer <metrics token>'",
                field="authorization",
                headers=_CHALLENGE,
            )
        return Principal(client_id="metrics", scopes=frozenset(), tier="admin", kind="metrics")
