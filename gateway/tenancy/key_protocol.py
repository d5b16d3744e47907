"""Request and response models of the admin key API (``/admin/keys``) and of key export/import
(``python -m gateway keys export|import``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.backends.catalog import model_name_problem
from gateway.tenancy.keys import KEY_HASH_PATTERN, KEY_ID_PATTERN

__all__ = [
    "MAX_IMPORT_KEYS",
    "MAX_KEY_SCOPES",
    "CreateKeyRequest",
    "CreatedKey",
    "ExportedKey",
    "ImportKeysResponse",
    "KeyExport",
    "KeyInfo",
]

#: scopes one API key may list (as many as an imported key may carry)
MAX_KEY_SCOPES = 1000


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"name": "mobile-app", "scopes": ["image_classifier"], "tier": "standard"}]
        },
    )

    name: str = Field(min_length=1, max_length=200)
    scopes: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        max_length=MAX_KEY_SCOPES,
        description=f"model names (at most {MAX_KEY_SCOPES}), or ['*'] for all",
    )
    tier: str = Field("free", description="a tier of GATEWAY_TIER_LIMITS")

    @field_validator("scopes")
    @classmethod
    def _scope_names(cls, scopes: list[str]) -> list[str]:
        # A scope is a model name: the same rule admission applies, so no scope can name what no
        # request could reach (and a stored key stays small).
        for scope in scopes:
            problem = None if scope == "*" else model_name_problem(scope)
            if problem is not None:
                raise ValueError(problem)
        return scopes


class KeyInfo(BaseModel):
    key_id: str
    name: str
    scopes: list[str]
    tier: str
    created_at: float
    rotated_at: float | None = None
    revoked_at: float | None = None


class CreatedKey(KeyInfo):
    """A key as created or rotated: the only time its plaintext is shown."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "key_id": "3f9a0c1b2d4e",
                "name": "mobile-app",
                "scopes": ["image_classifier"],
                "tier": "standard",
                "created_at": 1764690000.0,
                "api_key": "gk_3f9a0c1b2d4e_Vx8...",
            }
        }
    )

    api_key: str = Field(description="shown once; only its SHA-256 is stored")


MAX_IMPORT_KEYS = 10_000


class ExportedKey(BaseModel):
    """One key as exported from a store: its id, the SHA-256 of its plaintext, and its metadata."""

    model_config = ConfigDict(extra="forbid")

    key_id: str = Field(pattern=KEY_ID_PATTERN, description="the public id (12 hex characters)")
    name: str = Field(min_length=1, max_length=200)
    key_hash: str = Field(
        pattern=KEY_HASH_PATTERN, description="SHA-256 (hex) of the plaintext key"
    )
    scopes: list[str] = Field(
        min_length=1, max_length=MAX_KEY_SCOPES, description="model names, or ['*'] for all"
    )
    tier: str = Field(min_length=1, max_length=100, description="a tier of GATEWAY_TIER_LIMITS")
    created_at: float = Field(ge=0)
    rotated_at: float | None = Field(None, ge=0)
    revoked_at: float | None = Field(None, ge=0)


class KeyExport(BaseModel):
    """A store's keys without any plaintext: what `python -m gateway keys export` writes and
    `POST /admin/keys/import` (or `python -m gateway keys import`) takes."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "keys": [
                        {
                            "key_id": "3f9a0c1b2d4e",
                            "name": "mobile-app",
                            "key_hash": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                            "scopes": ["image_classifier"],
                            "tier": "standard",
                            "created_at": 1764690000.0,
                            "rotated_at": None,
                            "revoked_at": None,
                        }
                    ]
                }
            ]
        },
    )

    keys: list[ExportedKey] = Field(
        max_length=MAX_IMPORT_KEYS, description=f"at most {MAX_IMPORT_KEYS:,} keys"
    )


class ImportKeysResponse(BaseModel):
    imported: list[str] = Field(description="key ids written")
    skipped: list[str] = Field(
        description="key ids already present with identical content (a re-run)"
    )
