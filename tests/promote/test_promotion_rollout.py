"""Rollouts under a steady client stream through the real gateway, on a real Triton: a candidate that
fails in the canary, a failed smoke test, a promoter that dies, a gateway that dies mid-rollout, and a
good candidate. Production never fails a request; the ensemble (``/v1/classify``) stays on N until
the canary gives its copy a share.

The streams: white images through the KServe v2 route (the answer names the version), and a photograph
through ``/v1/classify`` (the answer's top score says which classifier ran: candidates double the logits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from builders import repository as repo
from builders.triton_config import read_config
from promote.dependents import CANARY_SUFFIX
from promote.gates import PromotionPolicy
from promote.promoter import GatewayTraffic, PromotionOptions, PromotionTarget, promote, recover
from promote.records import PromotionRecord
from serving.launcher import TritonPorts, TritonServer
from tests.support.gateway_procs import ADMIN_TOKEN, GatewayProcess, create_key, start_gateway
from tests.support.promotion import (
    CLASSIFIER,
    ENSEMBLE,
    UPSTREAM_TIMEOUT_S,
    Answer,
    CandidateBuilds,
    ClientStream,
    CorruptedWeights,
    DoubledLogits,
    FailsOnWhiteImages,
    classify_score,
    copy_entries,
    expected_scores,
    kserve_version,
    photo_jpeg,
    step_time,
    streams,
)

pytestmark = pytest.mark.integration

MODELS = [CLASSIFIER, "image_preprocess", "image_postprocess", ENSEMBLE]
CANARY_COPY = ENSEMBLE + CANARY_SUFFIX
# The latency gate is under test in test_promotion_gates.py; here it runs short and with wide budgets
# (every candidate is as fast as production, and a busy 2-core machine must not refuse one). The canary
# sends half the traffic to N+1 until it has seen at least 4 requests; no settling pause: one gateway.
POLICY = PromotionPolicy(
    load_duration_s=1.0,
    load_rounds=1,
    load_concurrency=2,
    max_p99_regression=4.0,
    max_throughput_drop=0.8,
    canary_share=0.5,
    canary_duration_s=2.0,
    min_canary_requests=4,
    canary_timeout_s=60.0,
    settle_s=0.0,
)
WHITE = np.ones(
    (1, 3, 224, 224), dtype=np.float32
)  # (1.0 - 0.5) / 0.5: a white image, preprocessed
JPEG = photo_jpeg()


@dataclass
class Served:
    repository: Path
    server: TritonServer
    records: Path

    @property
    def url(self) -> str:
        return self.server.http_url

    def target(self, gateway: GatewayProcess | None) -> PromotionTarget:
        traffic = GatewayTraffic(gateway.url, ADMIN_TOKEN) if gateway is not None else None
        return PromotionTarget(self.repository, self.url, self.records, traffic)

    def production(self) -> int:
        version = repo.latest_version(self.repository, CLASSIFIER)
        assert version is not None
        return version


@pytest.fixture(scope="module")
def served(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    repository = copy_entries(model_repository, root / "repository", MODELS)
    server = TritonServer(repository, models=MODELS, ports=TritonPorts.free()).start()
    yield Served(repository, server, root / "promotions")
    server.stop()


@pytest.fixture
def gateway(served: Served, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = start_gateway(tmp_path, served.url, upstream_timeout_s=UPSTREAM_TIMEOUT_S)
    yield process
    process.stop()


@pytest.fixture
def copy_of_production(model_repository: Path, served: Served, tmp_path: Path) -> Path:
    """A candidate repository holding the built production entry itself (a real build output), gated."""
    return _gated(served, copy_entries(model_repository, tmp_path / "candidate", [CLASSIFIER]))


def _gated(served: Served, candidate: Path) -> Path:
    """Run the gates first, without the client streams (the rollout reuses their records)."""
    record = promote(
        CLASSIFIER,
        candidate,
        served.target(None),
        policy=POLICY,
        options=PromotionOptions(publish=False),
    )
    assert record.decision == "gates-passed", record.reason
    return candidate


def _start_streams(gateway: GatewayProcess) -> tuple[ClientStream, ClientStream]:
    headers, _ = create_key(gateway)
    direct, ensemble = streams(gateway.url, headers, kserve_version(WHITE), classify_score(JPEG))
    for stream in (direct, ensemble):  # both answered before the promotion begins
        stream.wait_for(lambda a: a.status == 200)
    return direct, ensemble


@dataclass
class _Watched:
    """A promotion and what both client streams saw, up to answers to requests sent after it returned."""

    record: PromotionRecord
    returned: float  # time.time() when promote() returned
    answers: list[Answer]  # the direct stream (KServe v2, white images)
    classified: list[Answer]  # the ensemble stream (/v1/classify)

    def first_after(self, answers: list[Answer]) -> Answer:
        return next(a for a in answers if a.sent > self.returned)


def _promote_under_streams(
    served: Served,
    gateway: GatewayProcess,
    candidate: Path,
    observer: Callable[[dict[str, object]], None],
    direct: ClientStream,
    ensemble: ClientStream,
) -> _Watched:
    try:
        record = promote(
            CLASSIFIER,
            candidate,
            served.target(gateway),
            policy=POLICY,
            options=PromotionOptions(observer=observer),
        )
        returned = time.time()
        direct.after(returned)
        ensemble.after(returned)
    finally:
        answers, classified = direct.stop(), ensemble.stop()
    return _Watched(record, returned, answers, classified)


def _close(score: str, expected: float) -> bool:
    try:
        return abs(float(score) - expected) < 1e-4
    except ValueError:
        return False


def _steps(record: PromotionRecord) -> dict[str, dict[str, object]]:
    return {str(s["step"]): s for s in record.steps}


def _ready_versions(url: str) -> list[int]:
    """Versions of the classifier the Triton at ``url`` serves."""
    with http.InferenceServerClient(url) as client:
        ready = sorted(
            int(m["version"])
            for m in client.get_model_repository_index()
            if m["name"] == CLASSIFIER and m.get("state") == "READY"
        )
    return ready


def _triton_state(served: Served) -> tuple[list[int], list[int], bool]:
    """Versions of the classifier Triton serves, the ensemble's classifier step version, canary copy
    loaded."""
    ready = _ready_versions(served.url)
    with http.InferenceServerClient(served.url) as client:
        steps = client.get_model_config(ENSEMBLE)["ensemble_scheduling"]["step"]
        copy_loaded = client.is_model_ready(CANARY_COPY)
    pinned = [int(s.get("model_version", -1)) for s in steps if s["model_name"] == CLASSIFIER]
    return ready, pinned, copy_loaded


def _assert_back_on(served: Served, version: int) -> None:
    ready, pinned, copy_loaded = _triton_state(served)
    assert ready == [version] and pinned == [version] and not copy_loaded
    assert repo.versions(served.repository, CLASSIFIER)[-1] == version
    assert not repo.unfinished_versions(served.repository, CLASSIFIER)
    assert not (served.repository / CLASSIFIER / str(version + 1)).exists()
    # The configuration on disk serves the newest versions again (it pinned N while N+1 was unfinished).
    assert not read_config(served.repository / CLASSIFIER / "config.pbtxt").version_policy.HasField(
        "specific"
    )


def test_a_candidate_failing_in_the_canary_is_rolled_back_and_production_never_fails(
    served: Served, gateway: GatewayProcess, candidate_builds: CandidateBuilds
) -> None:
    old = served.production()
    score_n, score_new = expected_scores(served.url, JPEG, old)
    candidate = _gated(served, candidate_builds(FailsOnWhiteImages))
    direct, ensemble = _start_streams(gateway)

    def observer(step: dict[str, object]) -> None:
        if step["step"] == "canary":  # the weights are set: the ensemble's copy takes a share
            ensemble.wait_for(lambda a: _close(a.value, score_new))

    watched = _promote_under_streams(served, gateway, candidate, observer, direct, ensemble)
    record, answers, classified = watched.record, watched.answers, watched.classified

    assert record.decision == "rolled-back", record.reason
    steps = _steps(record)
    watch = steps["canary watched"]
    assert watch["ok"] is False and int(watch["canary_failed"]) > 0  # type: ignore[call-overload]
    # The gateway counted every request it routed to production in the canary as answered.
    assert watch["production_failed"] == 0
    assert int(watch["production_requests"]) > 0  # type: ignore[call-overload]
    # Only requests the canary routed to N+1 failed: answered after it began, sent before the rollback.
    canary_began = step_time(steps[f"canary copy {CANARY_COPY} loaded"])
    back_on_n = step_time(steps["rollback: gateway traffic back on N"])
    failed = [a for a in answers if a.status != 200]
    assert failed, "the white images never reached version N+1"
    outside = [
        a
        for a in failed
        if not (a.status >= 500 and a.answered > canary_began and a.sent < back_on_n)
    ]
    assert not outside, (canary_began, back_on_n, outside[:3])
    assert {a.value for a in answers if a.status == 200} <= {str(old), str(old + 1)}
    assert {a.value for a in answers if a.sent > back_on_n} == {str(old)}
    _assert_ensemble_path(
        classified,
        score_n,
        score_new,
        canary_began,
        step_time(steps[f"rollback: gateway: {ENSEMBLE} unpinned"]),
    )
    _assert_back_on(served, old)


def _assert_ensemble_path(
    answers: list[Answer], score_n: float, score_new: float, canary_began: float, back_on_n: float
) -> None:
    """No ensemble request failed; N+1 answered none before the canary, and none sent after ``back_on_n``."""
    assert all(a.status == 200 for a in answers), [a for a in answers if a.status != 200][:3]
    assert all(_close(a.value, score_n) or _close(a.value, score_new) for a in answers)
    assert all(_close(a.value, score_n) for a in answers if a.answered < canary_began)
    assert all(_close(a.value, score_n) for a in answers if a.sent > back_on_n)
    assert any(a.answered < canary_began for a in answers)


def test_a_failed_smoke_test_rolls_back(
    served: Served,
    gateway: GatewayProcess,
    copy_of_production: Path,
    candidate_builds: CandidateBuilds,
) -> None:
    """The artifact that reaches the served repository is not the one the gates passed (replaced on its
    way there): the smoke test of N+1 under the production name catches it before any traffic."""
    old = served.production()
    score_n, _ = expected_scores(served.url, JPEG, old)
    wrong = candidate_builds(CorruptedWeights) / CLASSIFIER / "1" / "model.onnx"

    def observer(step: dict[str, object]) -> None:
        if step["step"] == "published unfinished":
            (served.repository / CLASSIFIER / str(old + 1) / "model.onnx").write_bytes(
                wrong.read_bytes()
            )

    watched = _promote_under_streams(
        served, gateway, copy_of_production, observer, *_start_streams(gateway)
    )
    record, answers, classified = watched.record, watched.answers, watched.classified

    assert record.decision == "rolled-back", record.reason
    assert (
        record.reason.startswith("smoke test: ")
        and "top-1 agreement with production 0.000" in record.reason
    )
    assert "canary" not in _steps(record)
    assert all(a.status == 200 and a.value == str(old) for a in answers), [
        a for a in answers if a.value != str(old)
    ][:3]
    assert all(a.status == 200 and _close(a.value, score_n) for a in classified)
    _assert_back_on(served, old)


class _PromoterKilled(BaseException):
    """What a killed promoter process looks like from inside: nothing after it runs."""


def test_a_promoter_that_dies_leaves_an_unfinished_version_the_next_promotion_cleans(
    served: Served, gateway: GatewayProcess, copy_of_production: Path
) -> None:
    old = served.production()
    score_n, _ = expected_scores(served.url, JPEG, old)

    def observer(step: dict[str, object]) -> None:
        if step["step"] == "loaded side by side":
            raise _PromoterKilled

    _, ensemble = _start_streams(gateway)
    try:
        with pytest.raises(_PromoterKilled):
            promote(
                CLASSIFIER,
                copy_of_production,
                served.target(gateway),
                policy=POLICY,
                options=PromotionOptions(observer=observer),
            )
        # Half done: N+1 is on disk and loaded, and still not a version for anything reading the repository.
        assert repo.unfinished_versions(served.repository, CLASSIFIER) == [old + 1]
        assert repo.latest_version(served.repository, CLASSIFIER) == old
        ready, pinned, _ = _triton_state(served)
        assert ready == [old, old + 1] and pinned == [old]
        ensemble.after(
            time.time()
        )  # with N+1 loaded and nobody watching, the ensemble still calls N
        # A Triton that starts on the repository now (a restarted pod, `--load-model=*`) loads N only.
        with TritonServer(
            served.repository, models=[CLASSIFIER], ports=TritonPorts.free()
        ) as restarted:
            assert _ready_versions(restarted.http_url) == [old]

        (left,) = recover(CLASSIFIER, served.target(gateway), policy=POLICY)
    finally:
        classified = ensemble.stop()
    assert left.decision == "rolled-back" and left.new_version == old + 1 and not left.failed_steps
    assert all(a.status == 200 and _close(a.value, score_n) for a in classified)
    _assert_back_on(served, old)


def test_a_gateway_dying_mid_rollout_leaves_a_record_of_the_steps_that_could_not_run(
    served: Served, gateway: GatewayProcess, copy_of_production: Path, tmp_path: Path
) -> None:
    old = served.production()
    killed_at: list[float] = []

    def observer(step: dict[str, object]) -> None:
        if step["step"] == "canary watched":  # the canary passed; the gateway goes before the shift
            killed_at.append(time.time())
            gateway.process.kill()

    direct, ensemble = _start_streams(gateway)
    try:
        record = promote(
            CLASSIFIER,
            copy_of_production,
            served.target(gateway),
            policy=POLICY,
            options=PromotionOptions(observer=observer),
        )
    finally:
        answers = direct.stop() + ensemble.stop()

    assert record.decision == "rollback-incomplete", record.reason
    failed = {str(s["step"]) for s in record.failed_steps}
    assert failed == {
        "gateway: traffic on N+1",
        "rollback: gateway traffic back on N",
        f"rollback: gateway: {ENSEMBLE} unpinned",
        "rollback: gateway weights cleared",
    }
    # Every other rollback step ran: Triton and the repository are back on N.
    _assert_back_on(served, old)
    # Clients saw answers until the gateway died, then none; never an error from a version.
    assert all(a.status == 200 for a in answers if a.answered < killed_at[0])
    assert all(a.status in (200, 0) for a in answers), [
        a for a in answers if a.status not in (200, 0)
    ][:3]

    # While the gateway is still down, the next promotion cannot finish the rollback, so it publishes nothing.
    again = promote(CLASSIFIER, copy_of_production, served.target(gateway), policy=POLICY)
    assert again.decision == "refused" and "still not rolled back" in again.reason, again.reason
    assert [s["ok"] for s in again.steps if s["step"] == "recovered an earlier attempt"] == [False]
    assert again.new_version is None
    _assert_back_on(served, old)

    # A new gateway, and the next promotion (here: its first step alone) finishes the rollback.
    replacement = start_gateway(
        tmp_path / "replacement", served.url, upstream_timeout_s=UPSTREAM_TIMEOUT_S
    )
    try:
        (finished,) = recover(CLASSIFIER, served.target(replacement), policy=POLICY)
        direct = next(streams(replacement.url, create_key(replacement)[0], kserve_version(WHITE)))
        try:
            direct.after(time.time())
        finally:
            after = direct.stop()
    finally:
        replacement.stop()
    assert finished.decision == "rolled-back" and finished.started_at == record.started_at
    assert after and all(a.status == 200 and a.value == str(old) for a in after)


def test_a_good_candidate_is_promoted_through_the_canary_and_the_ensemble_follows_only_then(
    served: Served, gateway: GatewayProcess, candidate_builds: CandidateBuilds
) -> None:
    old = served.production()
    score_n, score_new = expected_scores(served.url, JPEG, old)
    candidate = _gated(served, candidate_builds(DoubledLogits))
    direct, ensemble = _start_streams(gateway)

    def observer(step: dict[str, object]) -> None:
        if step["step"] == "canary":
            ensemble.wait_for(lambda a: _close(a.value, score_new))

    watched = _promote_under_streams(served, gateway, candidate, observer, direct, ensemble)
    record, answers, classified, returned = (
        watched.record,
        watched.answers,
        watched.classified,
        watched.returned,
    )
    # Exact, not racy: requests sent after promote() returned must be served by N+1.
    first_direct, first_classified = watched.first_after(answers), watched.first_after(classified)

    assert record.decision == "promoted", record.reason
    assert record.new_version == old + 1 and _steps(record)["canary watched"]["ok"] is True
    assert all(a.status == 200 for a in answers + classified), [
        a for a in answers + classified if a.status != 200
    ][:3]
    assert answers[0].value == str(old)
    assert first_direct.value == str(old + 1) and {
        a.value for a in answers if a.sent > returned
    } == {str(old + 1)}
    canary_began = step_time(_steps(record)[f"canary copy {CANARY_COPY} loaded"])
    assert all(_close(a.value, score_n) for a in classified if a.answered < canary_began)
    assert _close(first_classified.value, score_new)
    assert all(_close(a.value, score_new) for a in classified if a.sent > returned)

    ready, pinned, copy_loaded = _triton_state(served)
    assert (
        ready == [old + 1] and pinned == [-1] and not copy_loaded
    )  # the ensemble is back to its own config
    assert repo.latest_version(served.repository, CLASSIFIER) == old + 1
    assert not repo.unfinished_versions(served.repository, CLASSIFIER)
