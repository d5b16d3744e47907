"""One source of every request limit: what the gateway states and enforces is what the built models carry.

- The OpenAPI schema states :mod:`serving.limits`' numbers.
- The built configs carry the same numbers: the encoder's and the classifier's batch sizes, the
  queue policies and priority levels of every model, the diffusion pipeline's size limits; any config
  parameter named after a limit equals it; and the pipeline model's own request check accepts
  exactly the gateway's extremes and refuses one step past them.
- ``/v1/embeddings`` takes 33 to 2,048 inputs (more than the encoder's batch), split and put back in
  order: every vector equals the one its text gets straight from Triton (alone, or in batches of 16:
  not the gateway's split).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.http as http

from builders.families.diffusion import Checkpoint, pipeline_spec
from builders.python_models.diffusion_request import GenerationLimits, InvalidRequest, parse_rows
from builders.triton_config import read_config
from gateway.app import create_app
from gateway.settings import GatewaySettings
from serving.limits import DEFAULT_LIMITS
from tests.support.gateway_procs import create_key

pytestmark = pytest.mark.integration

LIMITS = DEFAULT_LIMITS


def _limit_values() -> dict[str, object]:
    """Every named limit (``max_source_pixels``, ``max_side`` ...) -> its value."""
    values: dict[str, object] = {}
    for group in (
        LIMITS.embeddings,
        LIMITS.image_generation,
        LIMITS.image_upload,
        LIMITS.image_decode,
    ):
        values.update(dataclasses.asdict(group))
    return values


def test_openapi_states_the_limits() -> None:
    schemas = create_app(GatewaySettings()).openapi()["components"]["schemas"]
    embeddings = schemas["EmbeddingsRequest"]["properties"]["input"]
    lists = [
        s
        for s in embeddings["anyOf"]
        if s.get("type") == "array" and s["items"].get("type") == "string"
    ]
    assert lists and lists[0]["maxItems"] == LIMITS.embeddings.max_inputs
    assert lists[0]["items"]["maxLength"] == LIMITS.embeddings.max_text_chars
    generation = schemas["ImageGenerationRequest"]["properties"]
    g = LIMITS.image_generation
    assert (
        generation["seed"]["maximum"] == g.max_seed and generation["seed"]["minimum"] == g.min_seed
    )
    # Optional fields are anyOf [the bounded type, null]: the bounds sit on the non-null branch.
    steps = next(s for s in generation["steps"]["anyOf"] if s.get("type") == "integer")
    assert steps["maximum"] == g.max_steps and steps["minimum"] == g.min_steps
    assert generation["guidance_scale"]["maximum"] == g.max_guidance
    assert generation["prompt"]["maxLength"] == g.max_prompt_chars


def test_built_configs_carry_the_same_limits(model_repository: Path) -> None:
    configs = {p.parent.name: read_config(p) for p in model_repository.glob("*/config.pbtxt")}
    assert configs["text_embedding"].max_batch_size == LIMITS.embeddings.batch_size
    assert configs["image_classifier"].max_batch_size == LIMITS.image_upload.max_count
    named = _limit_values()
    queue = LIMITS.queue
    for name, config in configs.items():
        for (
            key,
            parameter,
        ) in config.parameters.items():  # a parameter named after a limit is that limit
            if key in named:
                configured = float(parameter.string_value)
                assert configured == float(named[key]), f"{name}: {key}"  # type: ignore[arg-type]
        if config.platform == "ensemble":
            continue  # no queue of its own: its steps queue, with the ensemble request's priority and timeout
        batcher = config.dynamic_batching
        assert batcher.priority_levels == queue.priority_levels, name
        assert batcher.default_priority_level == queue.default_priority_level, name
        for level in range(1, queue.priority_levels + 1):
            policy, limit = batcher.priority_queue_policy[level], queue.policy(level)
            assert policy.timeout_action == policy.REJECT, name
            assert (
                policy.max_queue_size,
                policy.default_timeout_microseconds,
                policy.allow_timeout_override,
            ) == (limit.max_queue_size, limit.default_timeout_us, limit.allow_timeout_override), (
                f"{name} level {level}"
            )


def test_the_pipeline_accepts_exactly_what_the_gateway_accepts(sd_checkpoint: Path) -> None:
    spec = pipeline_spec(Checkpoint(sd_checkpoint))
    limits = GenerationLimits.from_parameters(
        {k: v.string_value for k, v in spec.config.parameters.items()}
    )
    g = LIMITS.image_generation
    assert limits.max_side == g.max_side and g.side_multiple % limits.side_multiple == 0
    assert limits.schedulers == tuple(g.schedulers)
    prompt = (
        "\U0001f98a" * g.max_prompt_chars
    ).encode()  # the longest prompt the gateway lets through, in bytes
    extremes = {
        "PROMPT": prompt,
        "NEGATIVE_PROMPT": prompt,
        "STEPS": g.max_steps,
        "GUIDANCE": g.max_guidance,
        "HEIGHT": g.max_side,
        "WIDTH": g.min_side,
        "SEED": g.max_seed,
        "SCHEDULER": list(g.schedulers)[-1],
    }
    dtypes = {
        "STEPS": np.int32,
        "GUIDANCE": np.float32,
        "HEIGHT": np.int32,
        "WIDTH": np.int32,
        "SEED": np.int64,
    }

    def values(**overrides: object) -> dict[str, np.ndarray | None]:
        merged = {**extremes, **overrides}
        return {
            k: np.array([[v]], dtype=dtypes.get(k, np.object_)) for k, v in merged.items()
        }  # one row each

    parse_rows(values(), limits)  # every extreme the gateway allows, the model allows
    parse_rows(
        values(STEPS=g.min_steps, GUIDANCE=g.min_guidance, SEED=g.min_seed, SCHEDULER="default"),
        limits,
    )
    for field, past in (
        ("STEPS", g.max_steps + 1),
        ("GUIDANCE", g.max_guidance * 1.01),
        ("HEIGHT", g.max_side + g.side_multiple),
        ("SEED", -1),
        ("SCHEDULER", "lms"),
    ):
        with pytest.raises(InvalidRequest, match=field):
            parse_rows(values(**{field: past}), limits)


@pytest.fixture(scope="module")
def client(gateway_factory, triton) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    gateway = gateway_factory(triton.http_url)
    _, created = create_key(gateway)
    return openai.OpenAI(
        base_url=gateway.url + "/v1", api_key=str(created["api_key"]), max_retries=0
    )


@pytest.mark.parametrize("count", [LIMITS.embeddings.batch_size + 1, LIMITS.embeddings.max_inputs])
def test_more_inputs_than_the_encoder_batch_are_split_and_kept_in_order(
    client, triton, count: int
) -> None:  # type: ignore[no-untyped-def]
    texts = [
        f"sentence number {i}: {'a cat' if i % 3 else 'espresso in a cup'} {'!' * (i % 7)}"
        for i in range(count)
    ]
    response = client.embeddings.create(
        model="text_embedding", input=texts, encoding_format="float"
    )
    got = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert [d.index for d in response.data] == list(range(count))
    step = 1 if count <= LIMITS.embeddings.batch_size + 1 else 16
    direct_rows = []
    with http.InferenceServerClient(triton.http_url) as direct:
        for start in range(
            0, count, step
        ):  # straight to Triton: each text alone, or in batches of 16
            rows = np.array([[t.encode()] for t in texts[start : start + step]], dtype=object)
            tensor = http.InferInput("TEXT", list(rows.shape), "BYTES")
            tensor.set_data_from_numpy(rows)
            direct_rows.extend(direct.infer("text_embedding", [tensor]).as_numpy("EMBEDDING"))
    # Batching pads texts to the longest in the batch (masked): the same vector up to float rounding.
    np.testing.assert_allclose(got, np.array(direct_rows), atol=1e-5)


def test_more_than_the_documented_inputs_are_refused_naming_input(  # type: ignore[no-untyped-def]
    client,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(
            model="text_embedding", input=["x"] * (LIMITS.embeddings.max_inputs + 1)
        )
    assert refused.value.status_code in (400, 422) and "input" in str(refused.value)
