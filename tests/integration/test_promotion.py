"""Promotion end to end: real candidate builds, a real Triton, real gates, rollout and refusals."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as http
from _gateway_procs import ADMIN_TOKEN, start_gateway

from builders.families.efficientnet import EfficientNetLite0
from builders.pipeline import BuildOptions, build_specs
from builders.repository import latest_version, versions
from builders.spec import WeightsInfo
from promote.gates import PromotionPolicy
from promote.promoter import GatewayTraffic, PromotionTarget, promote
from promote.records import history
from serving.launcher import TritonPorts, TritonServer

pytestmark = pytest.mark.integration

MODEL = "efficientnet_lite0"
# Short, alternating load rounds, bounded for CI. The budgets (P99 at most 2x, throughput at least half)
# still refuse the 4x slower candidate, and leave room for a noisy shared machine to slow one round.
POLICY = PromotionPolicy(load_duration_s=2.0, load_rounds=3, load_concurrency=4, canary_duration_s=2.0,
                         max_p99_regression=1.0, max_throughput_drop=0.5)


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
        return model, WeightsInfo(source="test:corrupted", pretrained=False, note="classifier rows shuffled")


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


@pytest.fixture(scope="module")
def production(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, TritonServer]]:
    repository = tmp_path_factory.mktemp("production")
    shutil.copytree(model_repository / MODEL, repository / MODEL)
    server = TritonServer(repository, models=[MODEL], ports=TritonPorts.free()).start()
    yield repository, server
    server.stop()


def _candidate(spec: EfficientNetLite0, tmp_path: Path) -> Path:
    candidates = tmp_path / "candidates"
    build_specs([spec], BuildOptions(repository=candidates, variants=False))
    return candidates


def _target(production: tuple[Path, TritonServer], tmp_path: Path) -> PromotionTarget:
    repository, server = production
    return PromotionTarget(repository, server.http_url, tmp_path / "records")


def test_corrupted_weights_are_refused_and_never_served(production, tmp_path: Path) -> None:
    repository, _ = production
    before = versions(repository, MODEL)
    record = promote(MODEL, _candidate(CorruptedWeights(), tmp_path), _target(production, tmp_path), policy=POLICY)
    assert record.decision == "refused"
    assert record.gates["parity"]["passed"], "the export itself is faithful; the model is what is bad"
    assert not record.gates["accuracy"]["passed"]
    assert "accuracy" in record.reason
    assert record.new_version is None
    assert versions(repository, MODEL) == before


def test_a_latency_regression_is_refused(production, tmp_path: Path) -> None:
    repository, _ = production
    before = versions(repository, MODEL)
    record = promote(MODEL, _candidate(FourTimesSlower(), tmp_path), _target(production, tmp_path), policy=POLICY)
    assert record.decision == "refused", record.gates
    assert record.gates["accuracy"]["passed"]
    assert not record.gates["latency"]["passed"]
    assert versions(repository, MODEL) == before


def test_a_good_candidate_is_promoted_through_a_canary_under_a_steady_stream(production, tmp_path: Path) -> None:
    repository, server = production
    old = latest_version(repository, MODEL)
    candidate = _candidate(EfficientNetLite0(), tmp_path)
    gateway = start_gateway(tmp_path, server.http_url)
    outcomes: list[str] = []
    stop = threading.Event()
    try:
        with gateway.client(headers={"X-Admin-Token": ADMIN_TOKEN}) as admin:
            created = admin.post("/admin/keys", json={"name": "stream", "scopes": [MODEL], "tier": "unlimited"})
            created.raise_for_status()
        key = created.json()["api_key"]
        pixels = EfficientNetLite0().sample_inputs()["input"][:1]
        body = {"inputs": [{"name": "input", "shape": list(pixels.shape), "datatype": "FP32",
                            "data": pixels.ravel().tolist()}]}

        def stream() -> None:
            with gateway.client(headers={"Authorization": f"Bearer {key}"}) as client:
                while not stop.is_set():
                    response = client.post(f"/v2/models/{MODEL}/infer", json=body)
                    if response.status_code != 200:
                        outcomes.append(f"{response.status_code}: {response.text[:200]}")
                    else:
                        outcomes.append(response.json()["model_version"])

        worker = threading.Thread(target=stream)
        worker.start()
        try:
            target = PromotionTarget(repository, server.http_url, tmp_path / "records",
                                     GatewayTraffic(gateway.url, ADMIN_TOKEN))
            record = promote(MODEL, candidate, target, policy=POLICY)
        finally:
            stop.set()
            worker.join(timeout=30)
    finally:
        gateway.stop()
    assert record.decision == "promoted", record.reason
    assert record.new_version == old + 1
    assert "canary" in [step["step"] for step in record.steps]
    failed = [o for o in outcomes if o not in (str(old), str(old + 1))]
    assert outcomes and not failed, failed[:3]
    assert outcomes[0] == str(old) and outcomes[-1] == str(old + 1), "traffic moved from N to N+1"
    ready = http.InferenceServerClient(server.http_url).get_model_repository_index()
    assert [int(m["version"]) for m in ready if m["name"] == MODEL and m["state"] == "READY"] == [old + 1]
    records = history(tmp_path / "records", MODEL)
    assert records[-1].decision == "promoted" and records[-1].finished_at
