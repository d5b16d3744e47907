"""The base of every settings object of the gateway: each room's (``*/settings.py``,
:mod:`gateway.http.connection_settings`) and :class:`gateway.settings.GatewaySettings`, which
composes them.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["EnvSettings"]


class EnvSettings(BaseSettings):
    """Fields read from the environment variables ``GATEWAY_<FIELD>`` (other variables ignored),
    frozen once read."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)
