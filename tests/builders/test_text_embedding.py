"""``text_embedding`` through the real Triton server against sentence-transformers' own embeddings."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as http

from builders.families.text_embedding import (
    ENCODER,
    HIDDEN,
    MAX_LENGTH,
    SAMPLE_SENTENCES,
    model_dir,
)
from builders.python_models.text_pooling import mean_pool_normalize
from loadtest.loadgen import TritonTarget, closed_loop
from serving.text_tokenization import load_tokenizer, tokenize
from tests.support.triton_stats import counts, wait_for_counts

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
def client(triton) -> Iterator[http.InferenceServerClient]:
    client = http.InferenceServerClient(triton.http_url, concurrency=8)
    yield client
    client.close()


def _embed(
    client: http.InferenceServerClient, texts: list[str], model: str = "text_embedding"
) -> np.ndarray:
    tensor = http.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(
        np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(-1, 1)
    )
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
    a, b, c = _embed(
        client,
        ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell today."],
    )
    assert a @ b > a @ c + 0.3


def test_tokenizer_truncates_long_text_and_pads_to_the_longest() -> None:
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    encoded = tokenize(tokenizer, ["word " * 600, "short", ""])
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert ids.shape == (3, MAX_LENGTH) and ids.dtype == np.int64
    assert ids[0, 0] == 101 and ids[0, -1] == 102, "[CLS] ... [SEP] survive truncation"
    assert mask[1].sum() == 3 and mask[2].sum() == 2, (
        "short text and empty text: [CLS] (word) [SEP]"
    )
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


def _token_rows(rows: list[list[int]]) -> np.ndarray:
    padded = np.full((len(rows), max(len(r) for r in rows)), -1, dtype=np.int64)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = row
    return padded


def test_token_ids_embed_exactly_as_their_text_and_tokens_are_counted(client) -> None:
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    texts = ["A man is playing a guitar.", "Hello!", "word " * 600]
    with_specials = [tokenizer.encode(t).ids for t in texts]
    without = [ids[1:-1] for ids in with_specials]  # what encode(add_special_tokens=False) gives
    tensor = http.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    from_text = client.infer("text_embedding", [tensor])
    for rows in (with_specials, without):
        ids = _token_rows(rows)
        tokens = http.InferInput("TOKEN_IDS", list(ids.shape), "INT64")
        tokens.set_data_from_numpy(ids)
        from_ids = client.infer("text_embedding", [tokens])
        np.testing.assert_array_equal(
            from_ids.as_numpy("EMBEDDING"), from_text.as_numpy("EMBEDDING")
        )
        np.testing.assert_array_equal(from_ids.as_numpy("TOKENS"), from_text.as_numpy("TOKENS"))
    assert from_text.as_numpy("TOKENS").ravel().tolist() == [len(ids) for ids in with_specials]


def test_token_ids_outside_the_vocabulary_fail_alone(client) -> None:
    from tritonclient.utils import InferenceServerException

    tokens = http.InferInput("TOKEN_IDS", [1, 2], "INT64")
    tokens.set_data_from_numpy(np.array([[7592, 10**6]], dtype=np.int64))
    with pytest.raises(InferenceServerException, match="outside the vocabulary"):
        client.infer("text_embedding", [tokens])
    assert _embed(client, ["still serving"]).shape == (1, HIDDEN)


def _texts_of_distinct_lengths(count: int, shortest: int = 48) -> list[str]:
    """``count`` texts whose token counts all differ (``shortest`` tokens and up, below 256)."""
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    words = " ".join(SAMPLE_SENTENCES).split()
    texts, seen, size = [], set(), 1
    while len(texts) < count:
        start = (size * 7) % len(words)
        text = " ".join((words[start:] + words * 4)[:size])
        length = len(tokenizer.encode(text).ids)
        if length >= shortest and length not in seen:
            seen.add(length)
            texts.append(text)
        size += 1
    return texts


async def test_mixed_length_requests_share_encoder_executions(client, triton) -> None:
    """Ragged batching: requests of different lengths meet in one encoder execution (Triton's statistics).

    Every request carries one text of a token count no other request has, so without ragged batching
    the dynamic batcher could never put two of them in one execution (inferences == executions). The
    texts are long enough (48-120 tokens) that the encoder, not the tokenizer, is where requests wait.
    """
    texts = _texts_of_distinct_lengths(48)
    requests = tuple({"TEXT": np.array([[t.encode()]], dtype=object)} for t in texts)
    target = TritonTarget(
        url=triton.http_url,
        model="text_embedding",
        inputs=requests,
        outputs=("EMBEDDING",),
        check=lambda out: bool(np.isfinite(out["EMBEDDING"]).all()),
    )
    before = counts(client, ENCODER)
    samples = await closed_loop(target, concurrency=16, duration_s=4.0)
    assert len(samples.status) >= 16 and set(samples.status.tolist()) == {200}
    assert set(samples.correct.tolist()) == {1}
    change = wait_for_counts(client, ENCODER, before, len(samples.status))
    assert change.inferences == len(samples.status) and change.failures == 0
    # Without ragged batching every execution would hold exactly one request. How many merge depends on
    # how busy the machine is (a 2-core CI runner merged 1.4 per execution, an idle one more), so the
    # claim is that mixed lengths merge at all, not how often.
    assert change.executions < change.inferences, change
    # And merging does not change an embedding: each text embeds as it does alone.
    alone = np.concatenate([_embed(client, [t]) for t in texts[:8]])
    together = np.concatenate(
        [
            p.get_result().as_numpy("EMBEDDING")
            for p in [client.async_infer("text_embedding", [_text_input(t)]) for t in texts[:8]]
        ]
    )
    assert _cosines(alone, together).min() >= 0.99999


def _text_input(text: str) -> http.InferInput:
    tensor = http.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return tensor
