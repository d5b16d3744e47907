"""``text_embedding`` through the real Triton server against sentence-transformers' own embeddings."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.http as http

from builders.families.text_embedding import HIDDEN, MAX_LENGTH, SAMPLE_SENTENCES, model_dir
from builders.python_models.text_pooling import mean_pool_normalize
from builders.python_models.text_tokenizer import load_tokenizer, tokenize

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = pytest.mark.integration

EDGE_CASES = (
    "",
    " ",
    "Ünïcödé façade — naïve café, 東京タワー, Ελληνικά, emoji 🙂🚀",
    "word " * 600,  # far beyond 256 tokens: truncated exactly as sentence-transformers truncates
    "\u200b\t\n zero-width and control characters \x00",
)
FP32_MIN_COSINE = 0.999
VARIANT_MIN_COSINE = 0.99


@pytest.fixture(scope="module")
def sentence_transformer():  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir()), device="cpu")


@pytest.fixture(scope="module")
def client(triton) -> http.InferenceServerClient:
    return http.InferenceServerClient(triton.http_url, concurrency=8)


def _embed(client: http.InferenceServerClient, texts: list[str], model: str = "text_embedding") -> np.ndarray:
    tensor = http.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(-1, 1))
    return client.infer(model, [tensor]).as_numpy("EMBEDDING")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_embeddings_match_sentence_transformers(client, sentence_transformer) -> None:
    texts = list(SAMPLE_SENTENCES)
    got = _embed(client, texts)
    expected = sentence_transformer.encode(texts, convert_to_numpy=True)
    assert got.shape == (len(texts), HIDDEN) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = _cosines(got, expected)
    assert cosines.min() >= FP32_MIN_COSINE, cosines


def test_fp16_variant_matches_sentence_transformers(client, sentence_transformer) -> None:
    texts = [*SAMPLE_SENTENCES, *EDGE_CASES]
    got = _embed(client, texts, model="text_embedding_fp16")
    expected = sentence_transformer.encode(texts, convert_to_numpy=True)
    assert got.shape == (len(texts), HIDDEN) and got.dtype == np.float32
    assert _cosines(got, expected).min() >= VARIANT_MIN_COSINE


def test_edge_cases_match_sentence_transformers(client, sentence_transformer) -> None:
    got = _embed(client, list(EDGE_CASES))
    expected = sentence_transformer.encode(list(EDGE_CASES), convert_to_numpy=True)
    assert np.isfinite(got).all()
    cosines = _cosines(got, expected)
    assert cosines.min() >= FP32_MIN_COSINE, dict(zip(EDGE_CASES, cosines.tolist(), strict=True))


def test_concurrent_single_requests_agree_with_one_batch(client) -> None:
    texts = list(SAMPLE_SENTENCES[:8])
    batched = _embed(client, texts)
    # In flight together, so the dynamic batcher may group them (the HTTP client is not thread-safe:
    # concurrency comes from its own async_infer pool).
    pending = []
    for text in texts:
        tensor = http.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        pending.append(client.async_infer("text_embedding", [tensor]))
    singles = np.concatenate([p.get_result().as_numpy("EMBEDDING") for p in pending])
    # Padding to a batch's longest text must not change any text's embedding.
    assert _cosines(batched, singles).min() >= 0.99999


def test_similar_sentences_are_closer_than_unrelated_ones(client) -> None:
    a, b, c = _embed(client, ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell today."])
    assert a @ b > a @ c + 0.3


def test_tokenizer_truncates_long_text_and_pads_to_the_longest() -> None:
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    encoded = tokenize(tokenizer, ["word " * 600, "short", ""])
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert ids.shape == (3, MAX_LENGTH) and ids.dtype == np.int64
    assert ids[0, 0] == 101 and ids[0, -1] == 102, "[CLS] ... [SEP] survive truncation"
    assert mask[1].sum() == 3 and mask[2].sum() == 2, "short text and empty text: [CLS] (word) [SEP]"
    assert (ids[2, 2:] == 0).all() and (encoded["token_type_ids"] == 0).all()


def test_tokenizer_matches_sentence_transformers_tokenizer(sentence_transformer) -> None:
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    texts = [*SAMPLE_SENTENCES, *EDGE_CASES]
    ours = tokenize(tokenizer, texts)
    theirs = sentence_transformer.tokenize(texts)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(ours[name], theirs[name].numpy(), err_msg=name)


def test_pooling_ignores_padding() -> None:
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    pooled = mean_pool_normalize(hidden, mask)
    expected = hidden[0, :3].mean(axis=0)
    np.testing.assert_allclose(pooled[0], expected / np.linalg.norm(expected), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, rtol=1e-6)


def test_empty_batch_is_a_clear_client_error(client) -> None:
    from tritonclient.utils import InferenceServerException

    tensor = http.InferInput("TEXT", [0, 1], "BYTES")
    tensor.set_data_from_numpy(np.zeros((0, 1), dtype=object))
    with pytest.raises(InferenceServerException):
        client.infer("text_embedding", [tensor])
