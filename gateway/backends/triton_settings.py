"""Settings of the way to Triton (address, transport, pool), the model catalog (names, aliases, the
model list's freshness), readiness, the request deadline and the per-model breaker and healer, part of
:class:`gateway.settings.GatewaySettings`.

Each field is the environment variable ``GATEWAY_<FIELD>``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from gateway.backends.catalog import ModelNameList, check_model_names
from gateway.backends.model_breaker import DEFAULT_BREAKER_FAILURES
from gateway.backends.model_healer import DEFAULT_HEAL_LOAD_TIMEOUT_S, DEFAULT_HEAL_MAX_BACKOFF_S
from gateway.env_settings import EnvSettings, count, seconds

__all__ = [
    "DEFAULT_MODEL_INDEX_MIN_REFRESH_S",
    "DEFAULT_MODEL_INDEX_TTL_S",
    "DEFAULT_READY_CACHE_S",
    "DEFAULT_READY_TIMEOUT_S",
    "DEFAULT_TRITON_GRPC_CHANNELS",
    "DEFAULT_TRITON_GRPC_URL",
    "DEFAULT_TRITON_HEALTH_TIMEOUT_S",
    "DEFAULT_TRITON_HTTP_URL",
    "DEFAULT_TRITON_POOL_SIZE",
    "DEFAULT_UPSTREAM_TIMEOUT_S",
    "TritonProtocol",
    "TritonSettings",
]

DEFAULT_TRITON_HTTP_URL = "127.0.0.1:8000"
DEFAULT_TRITON_GRPC_URL = "127.0.0.1:8001"
DEFAULT_TRITON_GRPC_CHANNELS = 4
DEFAULT_TRITON_POOL_SIZE = 64
DEFAULT_TRITON_HEALTH_TIMEOUT_S = 0.5
DEFAULT_UPSTREAM_TIMEOUT_S = 30.0
DEFAULT_MODEL_INDEX_TTL_S = 5.0
DEFAULT_MODEL_INDEX_MIN_REFRESH_S = 1.0
# /readyz: how long one answer is reused, and the deadline of each readiness call / synthetic inference.
DEFAULT_READY_CACHE_S = 5.0
DEFAULT_READY_TIMEOUT_S = 5.0


class TritonProtocol(StrEnum):
    """How the gateway talks to Triton (clients always reach the gateway over HTTP)."""

    HTTP = "http"  # tritonclient.http.aio, pooled connections
    GRPC = "grpc"  # tritonclient.grpc.aio, a few channels used in turn


class TritonSettings(EnvSettings):
    """The ``triton_*``, model-name, ``model_index_*``, ``ready_*``, breaker and healer fields, and
    ``upstream_timeout_s``."""

    triton_http_url: str = Field(
        DEFAULT_TRITON_HTTP_URL, description="host:port of Triton's HTTP endpoint"
    )
    triton_grpc_url: str = Field(
        DEFAULT_TRITON_GRPC_URL, description="host:port of Triton's gRPC endpoint"
    )
    triton_protocol: TritonProtocol = Field(
        TritonProtocol.HTTP, description="gateway -> Triton transport"
    )
    triton_pool_size: int = count(DEFAULT_TRITON_POOL_SIZE)
    triton_grpc_channels: int = count(
        DEFAULT_TRITON_GRPC_CHANNELS, "gRPC channels to Triton, used in turn", most=64
    )
    triton_health_timeout_s: float = seconds(DEFAULT_TRITON_HEALTH_TIMEOUT_S)
    upstream_timeout_s: float = seconds(
        DEFAULT_UPSTREAM_TIMEOUT_S,
        "each request's deadline; Triton gets what is left of it as the request timeout",
        most=3600,
    )
    classifier_model: str = "image_classifier"
    embedding_model: str = "text_embedding"
    image_generation_model: str = "stable_diffusion"
    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description='public name -> Triton model, e.g. {"all-MiniLM-L6-v2": "text_embedding"}',
    )
    model_index_ttl_s: float = seconds(
        DEFAULT_MODEL_INDEX_TTL_S, "how long Triton's model list is trusted"
    )
    model_index_min_refresh_s: float = seconds(
        DEFAULT_MODEL_INDEX_MIN_REFRESH_S,
        "an unknown model name re-reads Triton's model list at most this often",
        zero=True,
    )
    ready_models: Annotated[ModelNameList, NoDecode] = Field(
        (),
        description="Triton models /readyz requires: each READY and answering one synthetic inference "
        "(comma-separated in the environment); empty: Triton's server readiness only",
    )
    ready_cache_s: float = seconds(
        DEFAULT_READY_CACHE_S, "how long a /readyz answer is reused", zero=True
    )
    ready_timeout_s: float = seconds(
        DEFAULT_READY_TIMEOUT_S, "deadline of each /readyz call to Triton (synthetic inference too)"
    )
    breaker_failures: int = count(
        DEFAULT_BREAKER_FAILURES,
        "internal errors in a row that open a model's circuit breaker (a dead worker opens it at once)",
    )
    heal_max_backoff_s: float = seconds(
        DEFAULT_HEAL_MAX_BACKOFF_S, "longest wait between two reloads of a model being healed"
    )
    heal_load_timeout_s: float = seconds(
        DEFAULT_HEAL_LOAD_TIMEOUT_S, "deadline of one model reload through Triton's repository API"
    )

    @field_validator("triton_http_url", "triton_grpc_url")
    @classmethod
    def _no_scheme(cls, value: str) -> str:
        # tritonclient wants host:port; accept a pasted URL rather than failing later.
        for scheme in ("http://", "https://", "grpc://"):
            value = value.removeprefix(scheme)
        return value.rstrip("/")

    @field_validator("model_aliases")
    @classmethod
    def _alias_names(cls, value: dict[str, str]) -> dict[str, str]:
        check_model_names((*value, *value.values()))
        return value
