"""Admin API for API keys (create, list, rotate, revoke, import), behind ``GATEWAY_ADMIN_TOKEN``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from gateway.errors import BadRequest, Conflict, NotFound
from gateway.protocol.rest import problem_responses
from gateway.settings import GatewaySettings
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.key_protocol import (
    CreatedKey,
    CreateKeyRequest,
    ImportKeysResponse,
    KeyExport,
    KeyInfo,
)
from gateway.tenancy.keys import (
    ApiKeyRecord,
    KeyConflict,
    KeyStore,
    in_store_thread,
    records_from_export,
)

from ._deps import get_authenticator, get_store

router = APIRouter(prefix="/admin/keys", tags=["admin"])

KeyId = Annotated[str, Path(description="the key's public id", examples=["3f9a0c1b2d4e"])]
_ERRORS = problem_responses(401, 403, 404, 422, 503)
Store = Annotated[KeyStore, Depends(get_store)]
Auth = Annotated[Authenticator, Depends(get_authenticator)]
# the start of the 503 when the key store is unreachable
_OUTAGE = "the key store is unavailable"


def _info(record: ApiKeyRecord) -> KeyInfo:
    return KeyInfo(
        key_id=record.key_id,
        name=record.name,
        scopes=list(record.scopes),
        tier=record.tier,
        created_at=record.created_at,
        rotated_at=record.rotated_at,
        revoked_at=record.revoked_at,
    )


async def _created(store: KeyStore, auth: Authenticator, key_id: str, plaintext: str) -> CreatedKey:
    """The answer for a key just created or rotated: its record and, this once, its plaintext."""
    auth.invalidate(key_id)
    record = await in_store_thread(_OUTAGE, store.get, key_id)
    assert record is not None
    return CreatedKey(**_info(record).model_dump(), api_key=plaintext)


def _settings(auth: Authenticator) -> GatewaySettings:
    return auth.settings


def _check_tier(auth: Authenticator, tier: str, field: str = "tier") -> None:
    known = _settings(auth).tier_limits
    if tier not in known:
        raise BadRequest(f"unknown tier '{tier}' (known: {', '.join(sorted(known))})", field=field)


@router.post(
    "",
    response_model=CreatedKey,
    status_code=201,
    summary="Create an API key (its plaintext is shown once)",
    responses=_ERRORS,
)
async def create_key(body: CreateKeyRequest, store: Store, auth: Auth) -> CreatedKey:
    _check_tier(auth, body.tier)
    key_id, plaintext = await in_store_thread(
        _OUTAGE, store.create, body.name, body.scopes, body.tier
    )
    return await _created(store, auth, key_id, plaintext)


@router.get(
    "",
    response_model=list[KeyInfo],
    summary="List API keys (never their secrets)",
    responses=_ERRORS,
)
async def list_keys(
    store: Store,
    include_revoked: Annotated[bool, Query(description="also list revoked keys")] = True,
) -> list[KeyInfo]:
    return [_info(r) for r in await in_store_thread(_OUTAGE, store.list, include_revoked)]


@router.post(
    "/{key_id}/rotate",
    response_model=CreatedKey,
    summary="Give a key a new secret; the old one stops working",
    responses=_ERRORS,
)
async def rotate_key(key_id: KeyId, store: Store, auth: Auth) -> CreatedKey:
    try:
        plaintext = await in_store_thread(_OUTAGE, store.rotate, key_id)
    except KeyError as exc:
        raise NotFound(f"no active API key with id '{key_id}'", field="key_id") from exc
    return await _created(store, auth, key_id, plaintext)


@router.delete(
    "/{key_id}", response_model=KeyInfo, summary="Revoke a key (idempotent)", responses=_ERRORS
)
async def revoke_key(key_id: KeyId, store: Store, auth: Auth) -> KeyInfo:
    try:
        record = await in_store_thread(_OUTAGE, store.revoke, key_id)
    except KeyError as exc:
        raise NotFound(f"no API key with id '{key_id}'", field="key_id") from exc
    auth.invalidate(key_id)
    return _info(record)


@router.post(
    "/import",
    response_model=ImportKeysResponse,
    summary="Import keys exported from another store (hashes and metadata; all or nothing)",
    description=(
        "Takes the document `python -m gateway keys export` writes. Keys keep their ids, hashes, "
        "scopes, tiers and times, so existing clients keep working after a store migration. An id "
        "already present with identical content is skipped (a re-run is harmless); one present with "
        "other content is a 409 and nothing is written."
    ),
    responses=problem_responses(400, 401, 403, 409, 422, 503),
)
async def import_keys(body: KeyExport, store: Store, auth: Auth) -> ImportKeysResponse:
    for index, key in enumerate(body.keys):
        _check_tier(auth, key.tier, field=f"keys.{index}.tier")
    try:
        records = records_from_export(k.model_dump() for k in body.keys)
        result = await in_store_thread(_OUTAGE, store.import_records, records)
    except ValueError as exc:  # a duplicate id inside the batch
        raise BadRequest(str(exc), field="keys") from exc
    except KeyConflict as exc:
        raise Conflict(
            f"{len(exc.key_ids)} key id(s) already exist with other content, nothing was imported: "
            f"{', '.join(exc.key_ids[:20])}",
            field="keys",
        ) from exc
    auth.clear()
    return ImportKeysResponse(imported=result.imported, skipped=result.skipped)
