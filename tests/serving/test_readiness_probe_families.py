"""The readiness probe against every model family the builders make, on a real embedded Triton.

Each entry Triton serves must answer the probe's synthetic request (:func:`serving.readiness.probe_inputs`,
built from the entry's own config and card): image networks (FP32 tensors), the classifier ensemble
(BYTES images), the text embedding ensemble and its tokenizer (inputs all optional, BYTES), the
encoder (multi-input, dynamic axes), pooling, the Stable Diffusion pipelines (generation: the fewest
steps and the smallest side the limits allow) and their networks, and the tiny test models. The
default stack's models (``builders.registry.DEFAULT_MODELS``) are all among them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.registry import DEFAULT_MODELS
from serving.launcher import TritonPorts, TritonServer
from serving.readiness import model_problems, probe_inputs
from tests.support.tiny_repo import build_tiny_repository

pytestmark = pytest.mark.integration

#: generous: the first request of a Python model and one 64x64 diffusion step on a busy 2-core machine
PROBE_TIMEOUT_S = 120.0


def _served(server: TritonServer) -> list[str]:
    import httpx

    index = httpx.post(
        f"http://{server.http_url}/v2/repository/index", json={"ready": True}, timeout=30
    ).json()
    return sorted(entry["name"] for entry in index)


def test_probe_answers_on_every_family_of_the_test_repository(triton: TritonServer) -> None:
    models = _served(triton)
    assert set(DEFAULT_MODELS) <= set(models)
    assert {
        "text_tokenizer",
        "text_pooling",
        "minilm_encoder",
        "image_preprocess",
        "image_postprocess",
    } <= set(models)
    assert model_problems(f"http://{triton.http_url}", models, PROBE_TIMEOUT_S) == []


def test_probe_answers_on_the_diffusion_pipelines_and_networks(sd_triton: TritonServer) -> None:
    models = _served(sd_triton)
    assert {
        "stable_diffusion",
        "stable_diffusion_torch",
        "sd_unet",
        "sd_text_encoder",
        "sd_vae_decoder",
    } <= set(models)
    assert model_problems(f"http://{sd_triton.http_url}", models, PROBE_TIMEOUT_S) == []


def test_probe_answers_on_the_tiny_models(tmp_path: Path) -> None:
    with TritonServer(build_tiny_repository(tmp_path / "repo"), ports=TritonPorts.free()) as server:
        assert model_problems(f"http://{server.http_url}", _served(server), PROBE_TIMEOUT_S) == []


def test_probe_fails_where_the_model_refuses_the_request(triton: TritonServer) -> None:
    """The probe is not vacuous: the same call names a model whose request cannot be served."""
    problems = model_problems(
        f"http://{triton.http_url}", ["text_embedding", "no_such_model"], PROBE_TIMEOUT_S
    )
    assert len(problems) == 1 and problems[0].startswith("no_such_model: not READY")


def test_all_optional_inputs_send_one_payload_and_generation_asks_for_the_cheapest_image() -> None:
    embedding = probe_inputs(
        {
            "max_batch_size": 32,
            "parameters": {"task": {"string_value": "embeddings"}},
            "input": [
                {"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"], "optional": True},
                {"name": "TOKEN_IDS", "data_type": "TYPE_INT64", "dims": ["-1"], "optional": True},
            ],
        }
    )
    assert [(i.name, i.shape) for i in embedding] == [("TEXT", (1, 1))]
    generation = probe_inputs(
        {
            "max_batch_size": 8,
            "parameters": {
                "task": {"string_value": "image-generation"},
                "limit_min_steps": {"string_value": "1"},
                "limit_min_side": {"string_value": "60"},
                "limit_side_multiple": {"string_value": "16"},
            },
            "input": [
                {"name": n, "data_type": t, "dims": ["1"], "optional": n != "PROMPT"}
                for n, t in (
                    ("PROMPT", "TYPE_STRING"),
                    ("STEPS", "TYPE_INT32"),
                    ("GUIDANCE", "TYPE_FP32"),
                    ("HEIGHT", "TYPE_INT32"),
                    ("WIDTH", "TYPE_INT32"),
                )
            ],
        }
    )
    assert {i.name: i.number for i in generation} == {
        "PROMPT": 0,
        "STEPS": 1,
        "HEIGHT": 64,
        "WIDTH": 64,
    }
