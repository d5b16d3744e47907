"""``/v1/classify`` through the real gateway to the lead's real image models (``triton`` fixture)."""

from __future__ import annotations

import io

import httpx
import pytest
from PIL import Image

from tests.support.gateway_procs import ADMIN_TOKEN

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CAT_CLASSES = set(range(281, 286))  # ImageNet tabby, tiger cat, Persian, Siamese, Egyptian cat


@pytest.fixture(scope="module")
def image_gateway(gateway_factory, triton):  # type: ignore[no-untyped-def]
    gateway = gateway_factory(triton.http_url, max_body_bytes=4 * 1024 * 1024)
    key = httpx.post(
        gateway.url + "/admin/keys",
        json={
            "name": "img",
            "scopes": ["image_classifier", "efficientnet_lite0"],
            "tier": "unlimited",
        },
        headers={"X-Admin-Token": ADMIN_TOKEN},
    ).json()
    return gateway, {"Authorization": f"Bearer {key['api_key']}"}


def _jpeg() -> bytes:
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.chelsea()).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def test_classify_a_cat(image_gateway) -> None:
    gateway, auth = image_gateway
    files = [
        ("file", ("chelsea.jpg", _jpeg(), "image/jpeg")),
        ("file", ("again.jpg", _jpeg(), "image/jpeg")),
    ]
    response = httpx.post(gateway.url + "/v1/classify", files=files, headers=auth, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "image_classifier" and len(body["results"]) == 2
    top = body["results"][0]["top"]
    assert len(top) == 5 and top[0]["class_id"] in CAT_CLASSES, top
    assert all(0.0 <= p["score"] <= 1.0 for p in top) and top[0]["label"]


def test_classify_refuses_what_is_not_an_image(image_gateway) -> None:
    gateway, auth = image_gateway
    response = httpx.post(
        gateway.url + "/v1/classify",
        files=[("file", ("x.txt", b"hello", "text/plain"))],
        headers=auth,
    )
    assert response.status_code == 400 and response.json()["field"] == "file"
    corrupt = b"\xff\xd8\xff" + b"\x00" * 200  # looks like a JPEG, is not one: Triton refuses it
    response = httpx.post(
        gateway.url + "/v1/classify",
        files=[("file", ("x.jpg", corrupt, "image/jpeg"))],
        headers=auth,
        timeout=60,
    )
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    missing = httpx.post(gateway.url + "/v1/classify", headers=auth)
    assert missing.status_code == 422 and missing.json()["field"] == "file"
