"""What the promotion tests share: candidate models (real builds), a served repository, client streams.

A client stream is a thread that sends one request after another through the real gateway and keeps,
for each, when it was sent and answered (wall clock, comparable with the promotion record's step
times), the HTTP status and what identifies the version that answered. It is not a load generator
(``loadtest.loadgen`` measures throughput and latency; nothing here is timed): it is the client whose
every answer a rollout test asserts on.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from builders.families.efficientnet import EfficientNetLite0
from builders.pipeline import BuildOptions, build_specs
from builders.spec import ModelSpec, WeightsInfo
from tests.support.variant_repos import copy_entries

__all__ = [
    "CLASSIFIER",
    "CLIENT_TIMEOUT_S",
    "ENSEMBLE",
    "UPSTREAM_TIMEOUT_S",
    "Answer",
    "CandidateBuilds",
    "ClientStream",
    "CorruptedWeights",
    "DoubledLogits",
    "FailsOnWhiteImages",
    "FourTimesSlower",
    "classify_score",
    "copy_entries",
    "expected_scores",
    "kserve_version",
    "photo_jpeg",
    "step_time",
    "streams",
]

CLASSIFIER = "efficientnet_lite0"
ENSEMBLE = "image_classifier"


class CorruptedWeights(EfficientNetLite0):
    """The real model with its classifier rows shuffled: exports faithfully, names the wrong classes."""

    def load(self):  # type: ignore[no-untyped-def]
        import torch

        model, _ = super().load()
        head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        order = torch.randperm(head.out_features, generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            head.weight.copy_(head.weight[order])
            head.bias.copy_(head.bias[order])
        return model, WeightsInfo(
            source="test:corrupted", pretrained=False, note="classifier rows shuffled"
        )


class FourTimesSlower(EfficientNetLite0):
    """Same predictions, four forward passes per request: a latency regression."""

    def load(self):  # type: ignore[no-untyped-def]
        import torch

        model, info = super().load()

        class Slow(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                # Distinct inputs per pass, so graph optimisers cannot merge the four passes into one.
                return sum(self.inner(x * (1.0 + 1e-4 * i)) for i in range(4)) / 4

        return Slow().eval(), info


class DoubledLogits(EfficientNetLite0):
    """Twice the logits: the same classes in the same order (every gate passes), but sharper scores,
    so an answer of the ``image_classifier`` ensemble says which version ran."""

    def load(self):  # type: ignore[no-untyped-def]
        import torch

        model, info = super().load()

        class Doubled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.inner(x) * 2

        return Doubled().eval(), info


class FailsOnWhiteImages(EfficientNetLite0):
    """Doubled logits, and a bug the golden photographs cannot show: a batch holding an all-white
    image fails (an out-of-range index). Passes every gate and the smoke test; fails in the canary."""

    def load(self):  # type: ignore[no-untyped-def]
        import torch

        model, info = super().load()

        class Fragile(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model
                self.register_buffer("offset", torch.zeros(1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                white = (x.mean(dim=(1, 2, 3)) > 0.99).any().long() * 1000
                return self.inner(x) * 2 + self.offset[white]

        return Fragile().eval(), info


class CandidateBuilds:
    """Candidate repositories built once per test session from a spec class (real exports)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[type[ModelSpec], Path] = {}

    def __call__(self, spec: type[ModelSpec]) -> Path:
        if spec not in self._built:
            repository = self.root / spec.__name__
            build_specs([spec()], BuildOptions(repository=repository, variants=False))
            self._built[spec] = repository
        return self._built[spec]


def photo_jpeg(name: str = "chelsea") -> bytes:
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(getattr(data, name)()[..., :3])).save(
        buffer, format="JPEG", quality=92
    )
    return buffer.getvalue()


def step_time(record_step: dict[str, object]) -> float:
    """A record step's time (when it ended) as a Unix timestamp."""
    return datetime.fromisoformat(str(record_step["at"])).timestamp()


@dataclass(frozen=True)
class Answer:
    sent: float  # time.time()
    answered: float
    status: int  # 0: no answer (refused, reset)
    value: str  # what identifies the version that answered, or the error


#: How long a rollout test's client waits for one answer, and the gateway's deadline under it
#: (``upstream_timeout_s``). On the embedded Triton a request to a model that is loaded waits while
#: another model loads (6-10 s for an ONNX classifier on an idle 2-core machine, several times that
#: when the machine is shared), and a rollout loads and unloads models while the streams run. So the
#: client waits longer than the gateway, and the gateway longer than any load: an answer is then
#: always the gateway's, and a request cut short is a failure the test reports, never noise.
UPSTREAM_TIMEOUT_S = 180.0
CLIENT_TIMEOUT_S = UPSTREAM_TIMEOUT_S + 30.0


@dataclass
class ClientStream:
    """Requests one after another through the gateway, each answer kept (see the module docstring).

    Args:
        url: the gateway (started with ``upstream_timeout_s=UPSTREAM_TIMEOUT_S``).
        headers: credentials.
        send: sends one request with the client; returns (status, identifying value or error text).
    """

    url: str
    headers: dict[str, str]
    send: Callable[[httpx.Client], tuple[int, str]]
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        with httpx.Client(
            base_url=self.url, headers=self.headers, timeout=CLIENT_TIMEOUT_S
        ) as client:
            while not self._stop.is_set():
                sent = time.time()
                try:
                    status, value = self.send(client)
                except httpx.TransportError as exc:
                    status, value = 0, f"no answer: {exc!r}"
                    self._stop.wait(0.05)  # a dead gateway must not become a busy loop
                self.answers.append(Answer(sent, time.time(), status, value))

    def start(self) -> ClientStream:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def wait_for(
        self, predicate: Callable[[Answer], bool], timeout_s: float = CLIENT_TIMEOUT_S
    ) -> Answer:
        """Block until an answer satisfies ``predicate`` (the state a test asserts on), and return it."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            answers = list(self.answers)
            for answer in answers[seen:]:
                if predicate(answer):
                    return answer
            seen = len(answers)
            time.sleep(0.02)
        raise AssertionError(f"no such answer within {timeout_s} s; last: {self.answers[-3:]}")

    def after(self, moment: float) -> Answer:
        """The first answer to a request sent after ``moment`` (waits for it)."""
        return self.wait_for(lambda a: a.sent > moment)

    def stop(self) -> list[Answer]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CLIENT_TIMEOUT_S + 10)
        return list(self.answers)


def kserve_version(pixels: np.ndarray) -> Callable[[httpx.Client], tuple[int, str]]:
    """Send ``pixels`` to the classifier through the KServe v2 route; the answer names its version."""
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(pixels.shape),
                "datatype": "FP32",
                "data": pixels.ravel().tolist(),
            }
        ]
    }

    def send(client: httpx.Client) -> tuple[int, str]:
        response = client.post(f"/v2/models/{CLASSIFIER}/infer", json=body)
        return response.status_code, (
            response.json()["model_version"] if response.status_code == 200 else response.text[:300]
        )

    return send


def classify_score(jpeg: bytes) -> Callable[[httpx.Client], tuple[int, str]]:
    """Send a photograph to ``/v1/classify`` (the ensemble); the answer's top score says which
    classifier ran."""

    def send(client: httpx.Client) -> tuple[int, str]:
        response = client.post("/v1/classify", files={"file": ("photo.jpg", jpeg, "image/jpeg")})
        if response.status_code != 200:
            return response.status_code, response.text[:300]
        return 200, f"{response.json()['results'][0]['top'][0]['score']:.6f}"

    return send


def streams(
    url: str, headers: dict[str, str], *sends: Callable[[httpx.Client], tuple[int, str]]
) -> Iterator[ClientStream]:
    """Start one stream per ``send``."""
    return (ClientStream(url, headers, send).start() for send in sends)


def expected_scores(triton_url: str, jpeg: bytes, version: int) -> tuple[float, float]:
    """The ensemble's top score for ``jpeg`` with the classifier's ``version``, and with its logits doubled
    (:class:`DoubledLogits`), computed from the real preprocessing and classifier steps."""
    import tritonclient.http as http

    with http.InferenceServerClient(triton_url) as client:
        image = http.InferInput("IMAGE", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[jpeg]], dtype=np.object_))
        pixels = client.infer("image_preprocess", [image]).as_numpy("PIXELS")
        tensor = http.InferInput("input", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        logits = (
            client.infer(CLASSIFIER, [tensor], model_version=str(version))
            .as_numpy("logits")[0]
            .astype(np.float64)
        )

    def top(values: np.ndarray) -> float:
        exp = np.exp(values - values.max())
        return float((exp / exp.sum()).max())

    return top(logits), top(2 * logits)
