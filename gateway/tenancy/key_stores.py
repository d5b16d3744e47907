"""Opening the configured API key store: Redis when a URL is set, else the SQLite file.

Above both stores (:mod:`gateway.tenancy.keys_sqlite`, :mod:`gateway.tenancy.redis_state`), which
build on :mod:`gateway.tenancy.keys`: the interface never imports an implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.tenancy.keys import ALL_MODELS, KeyStore

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

__all__ = ["bootstrap_first_key", "open_key_store"]


def open_key_store(settings: GatewaySettings) -> KeyStore:
    """The store the settings name: Redis when ``redis_url`` is set, else the SQLite file ``keys_db``.

    Args:
        settings: the gateway settings.

    Returns:
        An open store; close it with :meth:`KeyStore.close`.
    """
    url = settings.redis_url.get_secret_value()
    if url:
        from gateway.tenancy.redis_state import RedisKeyStore

        return RedisKeyStore(url, prefix=settings.redis_prefix, timeout_s=settings.redis_timeout_s)
    from gateway.tenancy.keys_sqlite import SqliteKeyStore

    return SqliteKeyStore(settings.keys_db)


def bootstrap_first_key(
    settings: GatewaySettings, name: str = "first-key", tier: str | None = None
) -> str:
    """Create an all-models key in the configured store, for the platform's start command.

    Args:
        settings: the gateway settings (the store and ``default_tier`` are used).
        name: the key's label.
        tier: the tier; the settings' default tier when ``None``.

    Returns:
        The plaintext key, to print once; only its hash is stored.
    """
    store = open_key_store(settings)
    try:
        _, plaintext = store.create(name, [ALL_MODELS], tier or settings.default_tier)
    finally:
        store.close()
    return plaintext
