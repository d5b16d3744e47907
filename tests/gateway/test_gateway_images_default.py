"""Images as a newcomer meets them: the ``openai`` SDK's plain ``images.generate(prompt=...)`` against
the real gateway in front of the real Triton serving the tiny random-init Stable Diffusion (the
session's ``sd_triton``, one build per session), signed URLs that open without the key, and long
requests answered as jobs.
"""

from __future__ import annotations

import base64
import io
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import openai
import pytest
from PIL import Image

from gateway.jobs.image_urls import ImageUrlSigner
from tests.support.gateway_procs import ADMIN_TOKEN, create_key

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def image_gateway(gateway_factory, sd_triton):  # type: ignore[no-untyped-def]
    """The default settings: tiny generations are far inside the async threshold."""
    return gateway_factory(sd_triton.http_url)


@pytest.fixture(scope="module")
def eager_gateway(gateway_factory, sd_triton):  # type: ignore[no-untyped-def]
    """Every generation after its first is estimated past a millisecond: the "runs long" path, for sure."""
    return gateway_factory(sd_triton.http_url, image_async_after_s=0.001)


@pytest.fixture(scope="module")
def client(image_gateway) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    _, created = create_key(image_gateway)
    return openai.OpenAI(
        base_url=image_gateway.url + "/v1",
        api_key=str(created["api_key"]),
        max_retries=0,
        timeout=300,
    )


def _png(data: bytes) -> Image.Image:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image


def _wait_job(  # type: ignore[no-untyped-def]
    image_gateway, headers: dict[str, str], location: str
) -> dict[str, object]:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        job = httpx.get(image_gateway.url + location, headers=headers, timeout=30).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job  # type: ignore[no-any-return]
        time.sleep(0.2)  # polling interval of a bounded wait, not synchronisation by sleep
    raise AssertionError(f"job {location} did not finish")


def test_default_call_url_and_b64(image_gateway, client) -> None:  # type: ignore[no-untyped-def]
    # What `images.generate(prompt=...)` sends: the prompt alone. The model's own side and steps apply
    # (64 x 64 for the tiny model, from its card), and the first call has no estimate: it runs now.
    first = client.images.generate(prompt="a lighthouse at dawn")
    image = _png(base64.b64decode(first.data[0].b64_json))
    assert image.size == (64, 64)

    # A url answer opens without the API key (a browser, the SDKs' own downloads) and is signed.
    url = client.images.generate(prompt="a lighthouse", response_format="url").data[0].url
    assert url.startswith(image_gateway.url + "/v1/images/files/")
    fetched = httpx.get(url)
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert _png(fetched.content).size == (64, 64)

    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    base = f"{image_gateway.url}{parts.path}"
    # Tampered: a later expiry, another path, a changed signature, no signature -> 403 problem+json.
    for tampered in (
        f"{base}?expires={int(query['expires']) + 3600}&signature={query['signature']}",
        f"{base[:-2]}xx?expires={query['expires']}&signature={query['signature']}",
        f"{base}?expires={query['expires']}&signature={query['signature'][:-2]}AA",
        base,
    ):
        refused = httpx.get(tampered)
        assert refused.status_code == 403, tampered
        assert (
            refused.headers["content-type"].startswith(PROBLEM) and refused.json()["status"] == 403
        )
    # Expired: signed by the same key (derived from the admin token), an expiry in the past -> 410.
    old = ImageUrlSigner(ADMIN_TOKEN).sign(parts.path, -60)
    gone = httpx.get(image_gateway.url + old.relative())
    assert gone.status_code == 410 and gone.headers["content-type"].startswith(PROBLEM)
    assert "expired" in gone.json()["detail"]


def test_long_requests_become_jobs(eager_gateway) -> None:  # type: ignore[no-untyped-def]
    image_gateway = eager_gateway
    headers, _ = create_key(image_gateway)
    key_client = openai.OpenAI(
        base_url=image_gateway.url + "/v1",
        api_key=headers["Authorization"][7:],
        max_retries=0,
        timeout=300,
    )
    # No estimate before the first generation: it runs now, and teaches the gateway the model's pace.
    first = key_client.images.generate(prompt="warm-up", extra_body={"steps": 2})
    assert first.data and first.data[0].b64_json
    assert _png(base64.b64decode(first.data[0].b64_json)).size == (64, 64)
    raw = key_client.images.with_raw_response.generate(
        prompt="a slow fox", response_format="b64_json", extra_body={"steps": 3}
    )
    assert raw.status_code == 202
    location = raw.headers["location"]
    assert location.startswith("/v1/images/jobs/imgjob_")
    job = _wait_job(image_gateway, headers, location)
    assert (
        job["status"] == "succeeded"
        and job["request"]["width"] == 64
        and job["request"]["steps"] == 3
    )  # type: ignore[index]
    result = httpx.get(f"{image_gateway.url}{location}/result", headers=headers, timeout=30).json()
    assert _png(base64.b64decode(result["data"][0]["b64_json"])).size == (64, 64)


def test_prefer_respond_async_is_a_job(image_gateway) -> None:  # type: ignore[no-untyped-def]
    headers, _ = create_key(image_gateway)
    answer = httpx.post(
        image_gateway.url + "/v1/images/generations",
        headers={**headers, "Prefer": "respond-async"},
        json={"prompt": "a quiet harbour", "steps": 2},
        timeout=60,
    )
    assert answer.status_code == 202 and answer.headers["preference-applied"] == "respond-async"
    assert answer.json()["status"] in ("queued", "running", "succeeded")
    assert _wait_job(image_gateway, headers, answer.headers["location"])["status"] == "succeeded"
    # Refused input is refused before anything is queued.
    bad = httpx.post(
        image_gateway.url + "/v1/images/generations",
        headers={**headers, "Prefer": "respond-async"},
        json={"prompt": "x", "size": "65x64"},
        timeout=60,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "size"
