"""The promotion sequence: gates, then a rollout that cannot leave a half state.

    candidate build -> gates (parity, accuracy, latency) -> publish as version N+1 (marked unfinished)
    -> load N and N+1 side by side (gateway and ensembles pinned to N) -> smoke test N+1
    -> canary share of the model's and its ensembles' traffic -> full traffic -> commit -> unload N

The steps and the rollback are :mod:`promote.rollout`; how a family is judged is its spec's
evaluation (:mod:`builders.evaluation`). Every attempt leaves a :class:`PromotionRecord`, written
after each step. Before rolling out, the promotion finishes whatever an earlier attempt on the same
model left behind (:func:`recover`), and publishes nothing while that rollback still cannot finish.
One promotion per model at a time (the workflow's concurrency group): a second one would take the
first one's version N+1 for debris.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from builders import repository as repo
from builders.errors import BuildError
from builders.registry import get_spec
from builders.report import REPORT_NAME, BuildReport
from builders.spec import ModelSpec
from promote.dependents import find_dependents
from promote.evaluation import EvaluationData, evaluation_data
from promote.gates import GateResult, PromotionPolicy, accuracy_gate, latency_gate, parity_gate
from promote.gateway_traffic import GatewayTraffic
from promote.records import PromotionRecord, history
from promote.rollout import PromotionTarget, Rollout, RolloutFailed, StepObserver
from promote.triton_control import TritonControl

__all__ = [
    "ALL_GATES",
    "GatewayTraffic",
    "PromotionError",
    "PromotionOptions",
    "PromotionTarget",
    "promote",
    "recover",
]

ALL_GATES = ("parity", "accuracy", "latency")
_UNFINISHED = ("pending", "rollback-incomplete")


class PromotionError(Exception):
    """The promotion could not start (bad candidate, a model no family can judge, no production)."""


def _spec(model: str, weights: Mapping[str, str] | None) -> ModelSpec:
    try:
        spec = get_spec(model, weights)
    except BuildError as exc:  # an unknown model, a checkpoint that is not there
        raise PromotionError(str(exc)) from exc
    if not isinstance(spec, ModelSpec):
        raise PromotionError(
            f"'{model}' is a pipeline ({spec.family}) with no reference to judge it against; "
            "promote the networks it calls, and rebuild it"
        )
    return spec


def _evaluation(spec: ModelSpec) -> EvaluationData:
    try:
        return evaluation_data(spec)
    except NotImplementedError as exc:
        raise PromotionError(str(exc)) from exc


def _candidate(candidate_repo: Path, model: str) -> tuple[Path, int, BuildReport]:
    entry = candidate_repo / model
    version = repo.latest_version(candidate_repo, model)
    if version is None or not (entry / "config.pbtxt").exists():
        raise PromotionError(
            f"no built entry for '{model}' in candidate repository {candidate_repo}"
        )
    report_path = entry / str(version) / REPORT_NAME
    if not report_path.exists():
        raise PromotionError(f"candidate {entry / str(version)} has no {REPORT_NAME}")
    return entry, version, BuildReport.read(report_path)


@dataclass(frozen=True)
class PromotionOptions:
    """What one :func:`promote` call runs and whom it tells.

    Attributes:
        gates: the gates to run (those already passed for the same artifact are skipped).
        publish: roll the candidate out once every gate has passed.
        observer: called with every rollout step once it is recorded (progress; tests inject faults).
        weights: where the spec finds local weights or checkpoints (as ``inferctl build --weights``);
            a family's evaluation may need them (diffusion: the checkpoint's tokenizer).
    """

    gates: Iterable[str] = ALL_GATES
    publish: bool = True
    log: Callable[[str], None] = print
    observer: StepObserver | None = None
    weights: Mapping[str, str] | None = None


def promote(
    model: str,
    candidate_repo: Path,
    target: PromotionTarget,
    *,
    policy: PromotionPolicy | None = None,
    options: PromotionOptions = PromotionOptions(),
) -> PromotionRecord:
    """Run the gates on a candidate and, when they pass and ``options.publish`` is set, roll it out.

    Gates that an earlier record already passed for the same candidate artifact are not run again
    (so CI can run each gate as its own step and publish last).

    Raises:
        PromotionError: the candidate or production entry is missing, or the model's family says
            nothing about how to judge it.
    """
    policy = policy or PromotionPolicy()
    gates, publish, log, observer = options.gates, options.publish, options.log, options.observer
    weights = options.weights
    spec = _spec(model, weights)
    entry, candidate_version, report = _candidate(candidate_repo, model)
    sha = report.artifacts.get("model", {}).get("sha256", "")
    production = repo.latest_version(target.repository, model)
    if production is None:
        raise PromotionError(
            f"'{model}' has no production version in {target.repository}; build it there first"
        )
    record = PromotionRecord(
        model=model,
        candidate=str(candidate_repo.resolve()),
        candidate_sha256=sha,
        production_version=production,
    )
    for earlier in history(target.records_dir, model):
        if earlier.candidate_sha256 == sha:
            record.gates.update({k: v for k, v in earlier.gates.items() if v.get("passed")})
    wanted = [g for g in gates if g not in record.gates]
    triton = TritonControl(target.triton_url)
    data = _evaluation(spec) if publish or set(wanted) - {"parity"} else None
    try:
        record.write(target.records_dir)
        run = _Run(record, triton, target, policy, production, data, log, observer)
        _run_gates(run, spec, entry, candidate_version, wanted)
        missing = [g for g in ALL_GATES if not record.gates.get(g, {}).get("passed")]
        if any(not record.gates[g]["passed"] for g in wanted):
            failed = {g: record.gates[g]["reason"] for g in wanted if not record.gates[g]["passed"]}
            record.finish("refused", "; ".join(f"{g}: {r}" for g, r in failed.items()))
        elif not publish:
            record.finish("gates-passed")
        elif missing:
            record.finish("refused", f"gates not passed: {', '.join(missing)}")
        else:
            assert data is not None
            stuck = []
            for earlier in recover(model, target, policy=policy, log=log, observer=observer):
                done = earlier.decision != "rollback-incomplete"
                record.step(
                    "recovered an earlier attempt",
                    ok=done,
                    started_at=earlier.started_at,
                    decision=earlier.decision,
                    version=earlier.new_version,
                )
                stuck += [] if done else [f"version {earlier.new_version} ({earlier.reason})"]
            if stuck:
                # A rollout on top of a half-rolled-back one would pin and route around its leftovers.
                record.finish(
                    "refused",
                    "an earlier attempt is still not rolled back: "
                    + "; ".join(stuck)
                    + "; nothing was published",
                )
                return _logged(record, log)
            production = repo.latest_version(target.repository, model) or production
            record.production_version = production
            _roll_out(run, model, entry / str(candidate_version), report)
    finally:
        record.write(target.records_dir)
    return _logged(record, log)


@dataclass(frozen=True)
class _Run:
    """One promotion's context, shared by its gates and its rollout.

    Attributes:
        record: what is being written down.
        triton: the production Triton's control API.
        target: where production lives.
        policy: thresholds and timings.
        production: the production version.
        data: the evaluation data (``None`` when no served gate runs and nothing is published).
        log: progress lines.
        observer: called with every rollout step once it is recorded.
    """

    record: PromotionRecord
    triton: TritonControl
    target: PromotionTarget
    policy: PromotionPolicy
    production: int
    data: EvaluationData | None
    log: Callable[[str], None]
    observer: StepObserver | None


def _logged(record: PromotionRecord, log: Callable[[str], None]) -> PromotionRecord:
    log(f"{record.model}: {record.decision}{' (' + record.reason + ')' if record.reason else ''}")
    return record


def _run_gates(run: _Run, spec: ModelSpec, entry: Path, version: int, wanted: list[str]) -> None:
    record, triton, target, data, policy, log = (
        run.record,
        run.triton,
        run.target,
        run.data,
        run.policy,
        run.log,
    )
    production = run.production
    model = spec.name
    if "parity" in wanted:
        _keep(record, parity_gate(spec, entry, version), log)
    served = [g for g in wanted if g != "parity"]
    if not served:
        return
    assert data is not None
    candidate_name = f"{model}__candidate"
    triton.load_candidate(entry, version, candidate_name)
    record.step("candidate loaded", as_model=candidate_name)
    try:
        prod, cand = (model, str(production)), (candidate_name, "1")
        if "accuracy" in served:
            _keep(
                record,
                _guarded("accuracy", lambda: accuracy_gate(target.triton_url, prod, cand, data)),
                log,
            )
        if "latency" in served:
            _keep(
                record,
                _guarded(
                    "latency", lambda: latency_gate(target.triton_url, prod, cand, data, policy)
                ),
                log,
            )
    finally:
        triton.unload(candidate_name)
        record.step("candidate unloaded")


def _guarded(name: str, gate: Callable[[], GateResult]) -> GateResult:
    """A gate whose requests fail (the candidate does not take production's inputs) fails, with the reason."""
    try:
        return gate()
    except Exception as exc:
        return GateResult(name, False, f"{type(exc).__name__}: {exc}")


def _keep(record: PromotionRecord, result: GateResult, log: Callable[[str], None]) -> None:
    record.gates[result.name] = result.as_dict()
    record.step(f"gate {result.name}", passed=result.passed)
    log(f"gate {result.name}: {'passed' if result.passed else 'FAILED ' + result.reason}")


def _roll_out(run: _Run, model: str, candidate_dir: Path, report: BuildReport) -> None:
    record, triton, target, policy, log = run.record, run.triton, run.target, run.policy, run.log
    production, data, observer = run.production, run.data, run.observer
    assert data is not None
    record.new_version = production + 1
    rollout = Rollout(
        model,
        production,
        production + 1,
        target,
        triton,
        record,
        policy,
        find_dependents(target.repository, model, triton),
        log,
        observer,
    )
    try:
        rollout.pin_production()
        rollout.publish(candidate_dir, report)
        rollout.load_side_by_side()
        rollout.smoke_test(data)
        rollout.canary()
        rollout.shift()
        rollout.commit()
    except Exception as exc:
        cause = str(exc) if isinstance(exc, RolloutFailed) else f"{type(exc).__name__}: {exc}"
        log(f"{model}: rolling back: {cause}")
        failed = rollout.rollback()
        if failed:
            record.finish(
                "rollback-incomplete", f"{cause}; rollback steps that failed: {', '.join(failed)}"
            )
        else:
            record.finish("rolled-back", cause)
        return
    failed = rollout.retire()
    record.finish("promoted", f"clean-up steps that failed: {', '.join(failed)}" if failed else "")


def recover(
    model: str,
    target: PromotionTarget,
    *,
    policy: PromotionPolicy | None = None,
    log: Callable[[str], None] = print,
    observer: StepObserver | None = None,
) -> list[PromotionRecord]:
    """Finish what earlier attempts on ``model`` left: roll back every version still marked unfinished
    (in the repository, or named by a record that is ``pending`` or ``rollback-incomplete``), and
    retire the old version behind one that was committed by a promoter that died before retiring it.

    Returns:
        The records of the attempts it finished (each re-decided and rewritten).
    """
    policy = policy or PromotionPolicy()
    triton = TritonControl(target.triton_url)
    finished = repo.versions(target.repository, model)
    stale: dict[int, PromotionRecord | None] = {
        v: None for v in repo.unfinished_versions(target.repository, model)
    }
    committed: list[PromotionRecord] = []
    for earlier in history(target.records_dir, model):
        if earlier.decision not in _UNFINISHED or earlier.new_version is None:
            continue
        if earlier.new_version in finished:
            if earlier.decision == "pending" and finished and earlier.new_version == finished[-1]:
                committed.append(earlier)
        else:
            stale[earlier.new_version] = earlier
    done = []
    dependents = find_dependents(target.repository, model, triton) if stale or committed else []
    for version, left in sorted(stale.items()):
        below = [v for v in finished if v < version]
        record = left or PromotionRecord(
            model=model,
            candidate="(unknown: found unfinished in the repository)",
            candidate_sha256="",
            production_version=below[-1] if below else None,
            new_version=version,
        )
        if not below:
            log(f"{model}: version {version} is unfinished and nothing is older; removing it")
            repo.discard_unfinished(target.repository, [model])
            continue
        log(f"{model}: finishing the rollback of version {version} left by an earlier attempt")
        rollout = Rollout(
            model, below[-1], version, target, triton, record, policy, dependents, log, observer
        )
        rollout.touch_everything()
        failed = rollout.rollback()
        reason = "rolled back by a later promotion" + (
            f"; rollback steps that failed: {', '.join(failed)}" if failed else ""
        )
        record.finish("rollback-incomplete" if failed else "rolled-back", reason)
        record.write(target.records_dir)
        done.append(record)
    for earlier in committed:
        log(
            f"{model}: retiring version {earlier.production_version} behind version {earlier.new_version}"
        )
        assert earlier.production_version is not None and earlier.new_version is not None
        rollout = Rollout(
            model,
            earlier.production_version,
            earlier.new_version,
            target,
            triton,
            earlier,
            policy,
            dependents,
            log,
            observer,
        )
        failed = rollout.retire()
        earlier.finish(
            "promoted",
            "retired by a later promotion"
            + (f"; clean-up steps that failed: {', '.join(failed)}" if failed else ""),
        )
        earlier.write(target.records_dir)
        done.append(earlier)
    return done
