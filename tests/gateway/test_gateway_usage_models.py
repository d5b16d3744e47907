"""Usage of the real models (``triton`` fixture): images classified, texts embedded, and tokens as the
model's own tokenizer counts them (Triton's ``TOKENS`` output), checked against the tokenizer itself."""

from __future__ import annotations

import io

import httpx
import pytest
from PIL import Image
from tokenizers import Tokenizer

from builders.families.text_embedding import MAX_LENGTH, model_dir
from tests.support.gateway_procs import create_key

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TEXTS = [
    "A cat sleeps on the warm windowsill.",
    "Espresso, please!",
    "Tokenizers split unfamiliar words: Zyxwvut.",
]


def _tokenizer_count(texts: list[str]) -> int:
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_LENGTH)
    tokenizer.no_padding()  # the shipped file pads every text to 128: count real tokens only
    return sum(
        len(encoding.ids) for encoding in tokenizer.encode_batch(texts)
    )  # [CLS] and [SEP] included


def _jpeg() -> bytes:
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.coffee()).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def test_images_inputs_and_tokenizer_tokens_are_metered(  # type: ignore[no-untyped-def]
    gateway_factory, triton
) -> None:
    gateway = gateway_factory(
        triton.http_url, max_body_bytes=4 * 1024 * 1024, usage_flush_interval_s=0.2
    )
    headers, key = create_key(gateway, name="usage-models")
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as client:
        embedded = client.post("/v1/embeddings", json={"model": "text_embedding", "input": TEXTS})
        assert embedded.status_code == 200, embedded.text
        files = [("file", (f"coffee{i}.jpg", _jpeg(), "image/jpeg")) for i in range(2)]
        assert client.post("/v1/classify", files=files).status_code == 200
        report = client.get("/v1/usage").json()
    expected_tokens = _tokenizer_count(TEXTS)
    # OpenAI's usage and the meter both carry the tokenizer's count, not a word count.
    assert embedded.json()["usage"]["prompt_tokens"] == expected_tokens
    rows = {r["model"]: r for r in report["data"]}
    assert (rows["text_embedding"]["inputs"], rows["text_embedding"]["tokens"]) == (
        3,
        expected_tokens,
    )
    assert rows["image_classifier"]["images"] == 2 and rows["image_classifier"]["requests"] == 1
    assert all(
        r["client"] == f"key:{key['key_id']}" and r["compute_ms"] > 0 for r in report["data"]
    )
