"""The base of every settings object of the gateway: each room's (``*/settings.py``,
:mod:`gateway.http.connection_settings`) and :class:`gateway.settings.GatewaySettings`, which
composes them; and the two kinds of field most of them are made of (:func:`seconds`, :func:`count`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["EnvSettings", "count", "seconds"]


class EnvSettings(BaseSettings):
    """Fields read from the environment variables ``GATEWAY_<FIELD>`` (other variables ignored),
    frozen once read."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)


def _field(default: Any, description: str | None, **bounds: float | None) -> Any:
    # Only what is given reaches Field, so each field is the one ``Field(default, gt=..., ...)``
    # would have made: Field records an explicit None as set, which leaving it out does not.
    given: dict[str, Any] = {name: bound for name, bound in bounds.items() if bound is not None}
    if description is not None:
        given["description"] = description
    return Field(default, **given)


def seconds(
    default: float, description: str | None = None, *, most: float | None = None, zero: bool = False
) -> Any:
    """A duration field: more than 0 seconds (0 too with ``zero``), at most ``most`` when given."""
    if zero:
        return _field(default, description, ge=0, le=most)
    return _field(default, description, gt=0, le=most)


def count(
    default: int, description: str | None = None, *, least: int = 1, most: int | None = None
) -> Any:
    """A whole-number field: at least ``least`` (1 unless given), at most ``most`` when given."""
    return _field(default, description, ge=least, le=most)
