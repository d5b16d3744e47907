"""The naive baseline server answers bad input as the gateway does: 400 naming the problem, not a 500."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from loadtest.naive_server import create_app
from tests.support.images import encode, photo


@pytest.mark.parametrize("handler", ["async", "threadpool"])
def test_classify_refuses_a_body_that_is_not_an_image_and_still_classifies_a_photo(
    handler: str,
) -> None:
    with TestClient(create_app(handler=handler, threads=1)) as client:
        refused = client.post("/classify", content=b"this is not an image")
        assert refused.status_code == 400
        assert "not a decodable image" in refused.json()["detail"]

        answer = client.post("/classify", content=encode(photo("chelsea"), "JPEG"))
        assert answer.status_code == 200
        assert len(answer.json()["class_ids"]) == 5
