"""What the routes that hand out generated images share (``/v1/images/generations``, a job's
``/result``, and the two image files behind their ``url`` answers): the answer's ``data`` entries,
the signed URL's query parameters and the OpenAPI description of an image file."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import Depends, Query, Request

from gateway.jobs.image_urls import ImageUrlSigner
from gateway.protocol.rest import ImageData, openai_responses
from gateway.settings import GatewaySettings
from gateway.tasks.openai_inputs import IMAGE_FORMATS

from ._deps import get_image_urls

__all__ = ["Expires", "Signature", "Signer", "b64_data", "image_responses", "url_data"]

Signer = Annotated[ImageUrlSigner, Depends(get_image_urls)]
# A signed URL's query, which ImageUrlSigner.check verifies (None: the request has none).
Expires = Annotated[str | None, Query(max_length=16)]
Signature = Annotated[str | None, Query(max_length=64)]


def image_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a route answering an image file: one of the output formats, or one
    of ``codes`` in OpenAI's error shape."""
    media_types: dict[str, Any] = {media_type: {} for _, media_type in IMAGE_FORMATS.values()}
    return {200: {"content": media_types}, **openai_responses(*codes)}


def b64_data(images: Iterable[bytes]) -> list[ImageData]:
    """A ``b64_json`` answer's entries."""
    return [ImageData(b64_json=base64.b64encode(image).decode("ascii")) for image in images]


def url_data(
    request: Request,
    settings: GatewaySettings,
    signer: ImageUrlSigner,
    paths: Iterable[str],
    ttl_s: float,
) -> list[ImageData]:
    """A ``url`` answer's entries: each of ``paths`` signed for ``ttl_s``, under the public URL
    (the request's own base where none is configured)."""
    base = settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")
    return [ImageData(url=base + signer.sign(path, ttl_s).relative()) for path in paths]
