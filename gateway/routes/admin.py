"""Admin API for API keys (create, list, rotate, revoke), behind ``GATEWAY_ADMIN_TOKEN``."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from gateway.auth import Authenticator
from gateway.errors import BadRequest, NotFound
from gateway.keys import ApiKeyRecord, KeyStore
from gateway.protocol import CreatedKey, CreateKeyRequest, KeyInfo, problem_responses
from gateway.settings import GatewaySettings

from ._deps import get_authenticator, get_store

router = APIRouter(prefix="/admin/keys", tags=["admin"])

KeyId = Annotated[str, Path(description="the key's public id", examples=["3f9a0c1b2d4e"])]
_ERRORS = problem_responses(401, 403, 404, 422)


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


def _settings(auth: Authenticator) -> GatewaySettings:
    return auth.settings


@router.post(
    "",
    response_model=CreatedKey,
    status_code=201,
    summary="Create an API key (its plaintext is shown once)",
    responses=_ERRORS,
)
async def create_key(
    body: CreateKeyRequest,
    store: Annotated[KeyStore, Depends(get_store)],
    auth: Annotated[Authenticator, Depends(get_authenticator)],
) -> CreatedKey:
    if body.tier not in _settings(auth).tier_limits:
        raise BadRequest(
            f"unknown tier '{body.tier}' (known: {', '.join(sorted(_settings(auth).tier_limits))})",
            field="tier",
        )
    key_id, plaintext = await asyncio.to_thread(store.create, body.name, body.scopes, body.tier)
    auth.invalidate(key_id)
    record = await asyncio.to_thread(store.get, key_id)
    assert record is not None
    return CreatedKey(**_info(record).model_dump(), api_key=plaintext)


@router.get(
    "", response_model=list[KeyInfo], summary="List API keys (never their secrets)", responses=_ERRORS
)
async def list_keys(
    store: Annotated[KeyStore, Depends(get_store)],
    include_revoked: Annotated[bool, Query(description="also list revoked keys")] = True,
) -> list[KeyInfo]:
    return [_info(r) for r in await asyncio.to_thread(store.list, include_revoked)]


@router.post(
    "/{key_id}/rotate",
    response_model=CreatedKey,
    summary="Give a key a new secret; the old one stops working",
    responses=_ERRORS,
)
async def rotate_key(
    key_id: KeyId,
    store: Annotated[KeyStore, Depends(get_store)],
    auth: Annotated[Authenticator, Depends(get_authenticator)],
) -> CreatedKey:
    try:
        plaintext = await asyncio.to_thread(store.rotate, key_id)
    except KeyError as exc:
        raise NotFound(f"no active API key with id '{key_id}'", field="key_id") from exc
    auth.invalidate(key_id)
    record = await asyncio.to_thread(store.get, key_id)
    assert record is not None
    return CreatedKey(**_info(record).model_dump(), api_key=plaintext)


@router.delete("/{key_id}", response_model=KeyInfo, summary="Revoke a key (idempotent)", responses=_ERRORS)
async def revoke_key(
    key_id: KeyId,
    store: Annotated[KeyStore, Depends(get_store)],
    auth: Annotated[Authenticator, Depends(get_authenticator)],
) -> KeyInfo:
    try:
        record = await asyncio.to_thread(store.revoke, key_id)
    except KeyError as exc:
        raise NotFound(f"no API key with id '{key_id}'", field="key_id") from exc
    auth.invalidate(key_id)
    return _info(record)
