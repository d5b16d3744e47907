"""The limit headers a client reads, through the real ``openai`` package against the real gateway:
OpenAI's ``x-ratelimit-*-requests`` beside the IETF ``RateLimit-*`` ones, on answers and refusals."""

from __future__ import annotations

import openai
import pytest

from gateway.tenancy.ratelimit import openai_duration
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration


def test_openai_durations() -> None:
    assert [openai_duration(s) for s in (0.0, 0.25, 1.0, 1.2, 59.5, 360.0, 3723.0)] == [
        "0ms",
        "250ms",
        "1s",
        "2s",
        "1m0s",
        "6m0s",
        "1h2m3s",
    ]


def test_openai_clients_read_the_request_limit_headers(gateway) -> None:  # type: ignore[no-untyped-def]
    _, created = create_key(gateway, tier="tiny")  # a burst of 4, then one a minute
    client = openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=str(created["api_key"]), max_retries=0
    )
    # This tiny deployment has no embedding model: each request is refused for the model's kind and
    # costs a token; once they are used up the key is refused 429 with the limit headers.
    for _ in range(4):
        with pytest.raises(openai.APIStatusError) as answered:
            client.embeddings.with_raw_response.create(model="tiny_linear", input="x")
        assert answered.value.status_code not in (401, 429), answered.value.response.text
    with pytest.raises(openai.RateLimitError) as refused:
        client.embeddings.with_raw_response.create(model="tiny_linear", input="x")
    headers = refused.value.response.headers
    assert headers["x-ratelimit-limit-requests"] == headers["ratelimit-limit"] == "4"
    assert headers["x-ratelimit-remaining-requests"] == headers["ratelimit-remaining"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s") and int(headers["retry-after"]) >= 1
    client.close()
