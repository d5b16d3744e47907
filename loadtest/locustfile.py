"""Locust scenarios: one User class per model and route, with API keys and tiers.

    python -m loadtest.run --host http://127.0.0.1:8080 --scenarios classify,embeddings,v2 --run-time 60s
    locust -f loadtest/locustfile.py --host http://127.0.0.1:8080        # the web UI

Users (pick them by class name on locust's command line, or by scenario name in ``loadtest.run``),
as scenario (class): route; payload:

- classify (ClassifyUser): POST /v1/classify (multipart ``file``); 1-3 skimage photographs
  encoded as JPEG
- embeddings (EmbeddingsUser): POST /v1/embeddings; 1-8 real English sentences
- generation (ImageGenerationUser): POST /v1/images/generations; a short prompt, small size,
  few steps
- v2 (V2TensorUser): POST /v2/models/{model}/infer (binary); one photograph as FP32
  [1, 3, 224, 224]
- free, standard, premium (FreeTierUser ...): POST /v2/models/{model}/infer; as v2, with that
  tier's key; 429 expected

Environment (read when a user starts, never at import):

- ``LOADTEST_API_KEY``: the key sent by every user but the tier users (``Authorization: Bearer``).
- ``LOADTEST_API_KEY_FREE`` / ``_STANDARD`` / ``_PREMIUM``: keys of those tiers, sent as
  ``X-API-Key`` so both credential headers are exercised. A tier user without its key stops.
- ``LOADTEST_TARGET``: ``gateway`` (default) or ``triton``: V2TensorUser talking to Triton directly
  (no key; only the v2 route exists there).
- ``LOADTEST_V2_MODEL`` (``efficientnet_lite0``), ``LOADTEST_V2_INPUT`` (``input``),
  ``LOADTEST_V2_OUTPUT`` (``logits``), ``LOADTEST_EMBEDDING_MODEL`` (``text_embedding``),
  ``LOADTEST_IMAGE_MODEL`` (the gateway's default), ``LOADTEST_IMAGE_SIZE`` (``64x64``),
  ``LOADTEST_IMAGE_STEPS`` (``4``).
- ``LOADTEST_WAIT``: think time between a user's requests, ``MIN,MAX`` seconds (``0.1,1.0``).
- ``LOADTEST_MAX_REQUESTS``: stop the run once this many requests have been answered (``0``: only
  ``--run-time`` stops it), so a smoke run ends on what it checks rather than on a clock.
- ``LOADTEST_SUMMARY``: a path where the final request and failure counts (total and per name) are
  written as JSON when locust quits; the CSV files are written on a timer and can miss the last
  second of a short run.

Responses are checked, not just counted: a 200 with the wrong shape is a failure. For tier users a
429 carrying ``Retry-After`` is the limiter doing its job: it is reported as a success under the
name ``<route> [429 rate limited]`` so the report shows how much was shed; a 429 without
``Retry-After`` is a failure.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

import gevent
from locust import HttpUser, between, events, task
from locust.exception import StopUser

from loadtest.payloads import (
    PROMPTS,
    SENTENCES,
    image_tensors,
    jpeg_images,
    v2_binary_request,
    v2_output,
)

__all__ = [
    "ClassifyUser",
    "EmbeddingsUser",
    "FreeTierUser",
    "ImageGenerationUser",
    "PremiumTierUser",
    "StandardTierUser",
    "V2TensorUser",
]


def _env(name: str, default: str) -> str:
    return os.environ.get(name, "") or default


def _wait_bounds() -> tuple[float, float]:
    raw = _env("LOADTEST_WAIT", "0.1,1.0").split(",")
    low = float(raw[0])
    return low, float(raw[1]) if len(raw) > 1 else low


def _think(user: Any) -> float:
    low, high = _wait_bounds()
    return between(low, high)(user)


@events.init.add_listener
def _stop_after_requests(environment: Any, **_: Any) -> None:
    limit = int(_env("LOADTEST_MAX_REQUESTS", "0"))
    if limit <= 0:
        return
    answered = 0

    def count(**_: Any) -> None:
        nonlocal answered
        answered += 1
        if answered == limit and environment.runner is not None:
            # Not from inside this request's own greenlet: quitting kills the users' greenlets.
            gevent.spawn_later(0, environment.runner.quit)

    environment.events.request.add_listener(count)


@events.quitting.add_listener
def _write_summary(environment: Any, **_: Any) -> None:
    path = os.environ.get("LOADTEST_SUMMARY")
    if not path or environment.runner is None:
        return
    stats = environment.runner.stats
    summary = {
        "requests": stats.total.num_requests,
        "failures": stats.total.num_failures,
        "entries": {
            name: {"requests": entry.num_requests, "failures": entry.num_failures}
            for (name, _method), entry in stats.entries.items()
        },
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(summary, handle)


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    # Visible in the web UI and settable from the command line; the environment still wins.
    parser.add_argument(
        "--api-key", env_var="LOADTEST_API_KEY", default="", help="API key for the gateway"
    )


class _GatewayUser(HttpUser):
    abstract = True
    #: which environment variable holds this user's key, and which header carries it
    key_variable = "LOADTEST_API_KEY"
    key_header = "bearer"
    #: a 429 with Retry-After is expected (tier users)
    rate_limited_ok = False

    #: when this user may send again: a 429's Retry-After is honoured, as a well-behaved client does
    #: (the gateway holds the connection of a key that does not: gateway/http/read_hold.py)
    _retry_at = 0.0

    def wait_time(self) -> float:
        return max(_think(self), self._retry_at - time.monotonic())

    def on_start(self) -> None:
        key = os.environ.get(self.key_variable, "")
        if not key and self.key_variable == "LOADTEST_API_KEY":
            key = getattr(self.environment.parsed_options, "api_key", "") or ""
        self.headers: dict[str, str] = {}
        if key:
            self.headers = (
                {"Authorization": f"Bearer {key}"}
                if self.key_header == "bearer"
                else {"X-API-Key": key}
            )
        elif self.rate_limited_ok:
            raise StopUser()

    def _post(
        self,
        path: str,
        check: Callable[[Any], str | None],
        *,
        headers: dict[str, str] | None = None,
        **request: Any,
    ) -> None:
        """POST ``path`` with this user's key; ``check`` says what is wrong with a 200 (None: nothing)."""
        with self.client.post(
            path,
            headers={**(headers or {}), **self.headers},
            name=path,
            catch_response=True,
            **request,
        ) as response:
            self._handle(response, check)

    def _handle(self, response: Any, check: Callable[[Any], str | None]) -> None:
        if response.status_code == 429 and self.rate_limited_ok:
            if response.headers.get("Retry-After"):
                try:
                    wait_s = float(response.headers["Retry-After"])
                except ValueError:  # an HTTP date: the gateway sends seconds
                    wait_s = 1.0
                self._retry_at = time.monotonic() + wait_s
                response.request_meta["name"] = (
                    f"{response.request_meta['name']} [429 rate limited]"
                )
                response.success()
            else:
                response.failure("429 without Retry-After")
            return
        if response.status_code != 200:
            response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            return
        try:
            problem = check(response)
        except (ValueError, KeyError, TypeError) as exc:
            problem = f"unreadable response: {exc}"
        if problem:
            response.failure(problem)
        else:
            response.success()


def _one_each(count: int, listed: str, item_field: str, what: str) -> Callable[[Any], str | None]:
    """The check of an answer that lists one item per input under ``listed``, each with a non-empty
    ``item_field`` (a top-5, an embedding): what is wrong, or None."""

    def check(response: Any) -> str | None:
        items = response.json()[listed]
        if len(items) == count and all(len(item[item_field]) > 0 for item in items):
            return None
        return f"expected {count} {what}, got {items!r:.200}"

    return check


class ClassifyUser(_GatewayUser):
    """Uploads 1-3 JPEG photographs to ``/v1/classify`` and checks every one got a top-5."""

    weight = 3

    @task
    def classify(self) -> None:
        photos = random.sample(jpeg_images(), k=random.randint(1, 3))
        files = [("file", (f"photo{i}.jpg", data, "image/jpeg")) for i, data in enumerate(photos)]
        check = _one_each(len(photos), "results", "top", "results with classes")
        self._post("/v1/classify", check, files=files)


class EmbeddingsUser(_GatewayUser):
    """Embeds 1-8 sentences through the OpenAI-style ``/v1/embeddings``."""

    weight = 3

    @task
    def embed(self) -> None:
        texts = random.sample(SENTENCES, k=random.randint(1, 8))
        body = {"model": _env("LOADTEST_EMBEDDING_MODEL", "text_embedding"), "input": texts}
        check = _one_each(len(texts), "data", "embedding", "embeddings")
        self._post("/v1/embeddings", check, json=body)


class ImageGenerationUser(_GatewayUser):
    """Asks ``/v1/images/generations`` for one small image from a short prompt."""

    weight = 1

    @task
    def generate(self) -> None:
        body: dict[str, Any] = {
            "prompt": random.choice(PROMPTS),
            "size": _env("LOADTEST_IMAGE_SIZE", "64x64"),
            "steps": int(_env("LOADTEST_IMAGE_STEPS", "4")),
            "seed": random.randint(0, 2**31 - 1),
        }
        if os.environ.get("LOADTEST_IMAGE_MODEL"):
            body["model"] = os.environ["LOADTEST_IMAGE_MODEL"]

        def check(response: Any) -> str | None:
            data = response.json()["data"]
            return None if data and data[0].get("b64_json") else "no b64_json image in the response"

        self._post("/v1/images/generations", check, json=body)


class V2TensorUser(_GatewayUser):
    """Sends one photograph as a raw FP32 tensor to ``/v2/models/{model}/infer`` (binary extension).

    With ``LOADTEST_TARGET=triton`` it talks to Triton itself (no key), the reference for the
    gateway's overhead.
    """

    weight = 2

    def on_start(self) -> None:
        if _env("LOADTEST_TARGET", "gateway") == "triton":
            self.headers = {}
        else:
            super().on_start()
        self.model = _env("LOADTEST_V2_MODEL", "efficientnet_lite0")
        self.output = _env("LOADTEST_V2_OUTPUT", "logits")
        name = _env("LOADTEST_V2_INPUT", "input")
        images = image_tensors()
        self.requests = [
            v2_binary_request({name: images[i : i + 1]}, [self.output]) for i in range(len(images))
        ]

    @task
    def infer(self) -> None:
        request = random.choice(self.requests)

        def check(response: Any) -> str | None:
            length = response.headers.get("Inference-Header-Content-Length")
            logits = v2_output(response.content, int(length) if length else None, self.output)
            return (
                None
                if logits.shape[0] == 1 and logits.size > 1
                else f"unexpected output shape {logits.shape}"
            )

        self._post(
            f"/v2/models/{self.model}/infer", check, headers=request.headers, data=request.body
        )


class FreeTierUser(V2TensorUser):
    """v2 requests with a free-tier key (``X-API-Key``); the tier's limit should shed most of them."""

    weight = 1
    key_variable = "LOADTEST_API_KEY_FREE"
    key_header = "x-api-key"
    rate_limited_ok = True


class StandardTierUser(FreeTierUser):
    key_variable = "LOADTEST_API_KEY_STANDARD"


class PremiumTierUser(FreeTierUser):
    key_variable = "LOADTEST_API_KEY_PREMIUM"
