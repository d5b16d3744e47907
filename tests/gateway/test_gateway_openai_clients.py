"""The official ``openai`` Python SDK against the real gateway, in front of the real Triton serving the
real models; every answer compared with the same request sent straight to Triton.

Default arguments included: a plain ``client.embeddings.create(model=..., input=...)`` asks for
base64 (the SDK decodes little-endian float32), and errors must reach the SDK as OpenAI error bodies
so it shows the gateway's message.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as http
from PIL import Image

from builders.families.text_embedding import HIDDEN, MAX_LENGTH, model_dir
from serving.text_tokenization import load_tokenizer
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

TEXTS = ["A man is playing a guitar.", "Please send me the invoice by Friday.", "Hello!"]
INTERNAL_STEPS = {
    "text_tokenizer",
    "text_pooling",
    "minilm_encoder",
    "minilm_encoder_fp16",
    "image_preprocess",
    "image_postprocess",
}


@pytest.fixture(scope="module")
def text_gateway(gateway_factory, triton):  # type: ignore[no-untyped-def]
    return gateway_factory(triton.http_url, model_aliases={"all-MiniLM-L6-v2": "text_embedding"})


@pytest.fixture(scope="module")
def client(text_gateway) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    headers, created = create_key(text_gateway)
    return openai.OpenAI(
        base_url=text_gateway.url + "/v1", api_key=str(created["api_key"]), max_retries=0
    )


@pytest.fixture(scope="module")
def direct(triton) -> Iterator[http.InferenceServerClient]:  # type: ignore[no-untyped-def]
    client = http.InferenceServerClient(triton.http_url)
    yield client
    client.close()


def _triton_embed(
    direct: http.InferenceServerClient, texts: list[str], model: str = "text_embedding"
) -> tuple[np.ndarray, int]:
    tensor = http.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    result = direct.infer(model, [tensor])
    return result.as_numpy("EMBEDDING"), int(result.as_numpy("TOKENS").sum())


def _vectors(response) -> np.ndarray:  # type: ignore[no-untyped-def]
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_default_call_is_base64_and_equals_direct_triton(  # type: ignore[no-untyped-def]
    client, direct
) -> None:
    raw = client.embeddings.with_raw_response.create(model="text_embedding", input=TEXTS)
    sent = raw.http_response.request.content
    assert b'"encoding_format":"base64"' in sent.replace(b" ", b""), "the SDK's default is base64"
    response = client.embeddings.create(model="text_embedding", input=TEXTS)
    expected, tokens = _triton_embed(direct, TEXTS)
    got = _vectors(response)
    assert got.shape == (len(TEXTS), HIDDEN) and got.tobytes() == expected.tobytes()
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
    assert response.model == "text_embedding"


def test_float_single_string_and_alias(client, direct) -> None:  # type: ignore[no-untyped-def]
    expected, tokens = _triton_embed(direct, TEXTS[:1])
    for model in ("text_embedding", "all-MiniLM-L6-v2"):
        response = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
        assert (
            _vectors(response).tobytes() == expected.tobytes()
            and response.usage.prompt_tokens == tokens
        )
    fp16, _ = _triton_embed(direct, TEXTS, model="text_embedding_fp16")
    got = _vectors(client.embeddings.create(model="text_embedding_fp16", input=TEXTS))
    assert got.tobytes() == fp16.tobytes(), "a variant is an embedding model too (its card says so)"


def test_token_arrays_of_the_models_vocabulary_embed_as_their_text(  # type: ignore[no-untyped-def]
    client, direct
) -> None:
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    ids = [tokenizer.encode(t).ids for t in TEXTS]
    expected, tokens = _triton_embed(direct, TEXTS)
    many = client.embeddings.create(model="text_embedding", input=ids)
    assert _vectors(many).tobytes() == expected.tobytes() and many.usage.prompt_tokens == tokens
    one = client.embeddings.create(
        model="text_embedding", input=ids[0][1:-1], encoding_format="float"
    )
    assert _vectors(one).tobytes() == expected[:1].tobytes(), "[CLS]/[SEP] are added where missing"
    with pytest.raises(openai.BadRequestError) as outside:
        client.embeddings.create(model="text_embedding", input=[[7592, 10**6]])
    assert "outside the vocabulary" in outside.value.message and outside.value.param == "input.0"


def test_dimensions_truncate_and_renormalise_up_to_the_models_length(  # type: ignore[no-untyped-def]
    client, direct
) -> None:
    expected, _ = _triton_embed(direct, TEXTS)
    for length in (HIDDEN, 128, 1):
        for encoding in (
            openai.NOT_GIVEN,
            "float",
        ):  # the SDK's default (base64, decoded by it), and floats
            got = _vectors(
                client.embeddings.create(
                    model="text_embedding", input=TEXTS, dimensions=length, encoding_format=encoding
                )
            )
            short = expected[:, :length] / np.linalg.norm(
                expected[:, :length], axis=1, keepdims=True
            )
            assert got.shape == (len(TEXTS), length)
            np.testing.assert_allclose(got, short, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    for past in (HIDDEN + 1, 0):
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="text_embedding", input="x", dimensions=past)
        error = refused.value
        assert error.status_code == 400 and error.param == "dimensions", error.message


def test_ids_the_models_tokenizer_never_makes_are_refused_naming_the_input(  # type: ignore[no-untyped-def]
    client,
) -> None:
    tokenizer = load_tokenizer(model_dir() / "tokenizer.json", MAX_LENGTH)
    good = tokenizer.encode(TEXTS[0], add_special_tokens=False).ids
    # Reserved WordPiece slots ([unused12], [unused278]): where tiktoken keeps "." (13) and " the" (279).
    for bad, problem in (
        ([*good[:2], 13, 279], "[unused12]"),
        ([good[0], 102, good[1]], "[SEP]"),
        ([good[0], 0], "[PAD]"),
        ([good[0], 30522], "outside the vocabulary"),
    ):
        inputs = (
            [good] * 40 + [bad] + [good]
        )  # past the first encoder batch: the index is the request's
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="text_embedding", input=inputs)
        error = refused.value
        assert (
            error.param == "input.40" and "input[40]" in error.message and problem in error.message
        ), error.message
    assert client.embeddings.create(model="text_embedding", input=[[100, *good]]).data, (
        "[UNK] is text's own"
    )


def test_errors_reach_the_sdk_with_their_reason(client, text_gateway) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert (
        missing.value.code == "model_not_found"
        and "text-embedding-3-small" in missing.value.message
    )
    with pytest.raises(openai.NotFoundError, match="does not serve embeddings"):
        client.embeddings.create(model="efficientnet_lite0", input="x")
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(model="text_embedding", input=["fine", ""])
    assert empty.value.param == "input.1"
    wrong = openai.OpenAI(
        base_url=text_gateway.url + "/v1", api_key="gk_000000000000_" + "x" * 43, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        wrong.embeddings.create(model="text_embedding", input="x")
    narrow = openai.OpenAI(
        base_url=text_gateway.url + "/v1",
        max_retries=0,
        api_key=str(create_key(text_gateway, scopes=["image_classifier"])[1]["api_key"]),
    )
    with pytest.raises(
        openai.PermissionDeniedError, match="not allowed to use model 'text_embedding'"
    ):
        narrow.embeddings.create(model="text_embedding", input="x")
    assert [m.id for m in narrow.models.list()] == ["image_classifier"]


def test_models_lists_what_a_client_can_call(client) -> None:  # type: ignore[no-untyped-def]
    listed = {m.id: m for m in client.models.list()}
    assert {
        "text_embedding",
        "text_embedding_fp16",
        "all-MiniLM-L6-v2",
        "image_classifier",
        "efficientnet_lite0",
    } <= set(listed)
    assert not INTERNAL_STEPS & set(listed), "pipeline steps are not models a client calls"
    assert all(m.object == "model" and m.created >= 0 and m.owned_by for m in listed.values())
    # Entries carry their publication time from the build on (older ones say 0).
    assert listed["text_embedding"].created > 1_700_000_000
    one = client.models.retrieve("text_embedding")
    assert (one.id, one.created) == ("text_embedding", listed["text_embedding"].created)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text_tokenizer")


async def test_async_client(text_gateway, direct) -> None:  # type: ignore[no-untyped-def]
    _, created = create_key(text_gateway)
    async with openai.AsyncOpenAI(
        base_url=text_gateway.url + "/v1", api_key=str(created["api_key"]), max_retries=0
    ) as client:
        response = await client.embeddings.create(model="text_embedding", input=TEXTS)
    assert _vectors(response).tobytes() == _triton_embed(direct, TEXTS)[0].tobytes()


# -- images ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_gateway(gateway_factory, sd_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(sd_triton.http_url, max_body_bytes=64 * 1024)


def _triton_image(sd_triton, seed: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    client = http.InferenceServerClient(sd_triton.http_url, network_timeout=120.0)
    values = {
        "PROMPT": ("BYTES", np.array([[b"a red fox"]], dtype=object)),
        "NEGATIVE_PROMPT": ("BYTES", np.array([[b""]], dtype=object)),
        "STEPS": ("INT32", np.array([[2]], dtype=np.int32)),
        "GUIDANCE": ("FP32", np.array([[7.5]], dtype=np.float32)),
        "HEIGHT": ("INT32", np.array([[64]], dtype=np.int32)),
        "WIDTH": ("INT32", np.array([[64]], dtype=np.int32)),
        "SEED": ("INT64", np.array([[seed]], dtype=np.int64)),
    }
    inputs = []
    for name, (datatype, array) in values.items():
        tensor = http.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        return client.infer("stable_diffusion", inputs).as_numpy("IMAGE")[0]  # type: ignore[no-any-return]
    finally:
        client.close()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_images_n_size_b64_and_url(image_gateway, sd_triton) -> None:  # type: ignore[no-untyped-def]
    headers, created = create_key(image_gateway)
    client = openai.OpenAI(
        base_url=image_gateway.url + "/v1",
        api_key=str(created["api_key"]),
        max_retries=0,
        timeout=300,
    )
    expected = [_triton_image(sd_triton, seed) for seed in (5, 6)]
    assert np.abs(expected[0].astype(int) - expected[1]).max() > 0, "two seeds, two images"
    b64 = client.images.generate(
        model="stable_diffusion",
        prompt="a red fox",
        n=2,
        size="64x64",
        response_format="b64_json",
        extra_body={"steps": 2, "seed": 5},
    )
    assert [_pixels(base64.b64decode(d.b64_json)).tobytes() for d in b64.data] == [
        e.tobytes() for e in expected
    ]

    linked = client.images.generate(
        prompt="a red fox",
        n=1,
        size="64x64",
        response_format="url",
        extra_body={"steps": 2, "seed": 6},
    )
    url = linked.data[0].url
    assert (
        url.startswith(image_gateway.url + "/v1/images/files/") and linked.data[0].b64_json is None
    )
    fetched = httpx.get(url)  # signed: a browser or image loader opens it without the key
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/png"
    assert _pixels(fetched.content).tobytes() == expected[1].tobytes()
    assert "private" in fetched.headers["cache-control"]

    with pytest.raises(openai.BadRequestError) as too_many:
        client.images.generate(prompt="a red fox", n=5, size="64x64")
    assert too_many.value.param == "n"
    with pytest.raises(openai.BadRequestError) as odd:
        client.images.generate(prompt="a red fox", size="65x64", extra_body={"steps": 2})
    assert odd.value.param == "size" and "multiple of 8" in odd.value.message
