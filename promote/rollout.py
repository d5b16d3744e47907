"""Rolling a gated candidate out as version N+1, and rolling it back, step by step.

    pin production (gateway on N, ensembles on N) -> publish N+1, marked unfinished (the entry's
    configuration on disk serves N only) -> load N and N+1
    -> smoke test N+1 -> canary (a share of the model's and of its ensembles' traffic, watched in
    Triton's statistics) -> shift (gateway and ensembles on N+1) -> commit (N+1 marked finished)
    -> retire N

Every step is recorded as it ends (``ok``, and ``error`` where it failed) and the record is written
after each, so a promoter that dies leaves its trail. Version N+1 carries the repository's
unfinished marker until the commit: until then nothing takes it for production (see
:mod:`builders.repository`).

A failure before the commit rolls back. The rollback steps run each on its own: one that fails (the
gateway cannot be reached) does not stop the others, and the decision is then
``rollback-incomplete`` with the failed steps named in the record. The next promotion of the model
finishes what an earlier attempt left (:func:`recover`). Steps after the commit (unloading N, the
canary copies, the weights) are clean-up: a failure there is recorded and the version stays promoted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from builders import repository as repo
from builders.report import REPORT_NAME, BuildReport
from builders.triton_config import read_config
from promote.canary import CanaryWatch
from promote.dependents import Dependent
from promote.evaluation import EvaluationData, Outcome, compare, infer_batch
from promote.gates import PromotionPolicy
from promote.gateway_traffic import GatewayTraffic, model_target
from promote.records import PromotionRecord
from promote.triton_control import TritonControl

__all__ = ["PromotionTarget", "Rollout", "RolloutFailed", "StepObserver"]

#: called with each recorded step (a dict: ``step``, ``at``, ``ok``, details) once it is written
StepObserver = Callable[[dict[str, Any]], None]


class RolloutFailed(Exception):
    """Version N+1 was found unfit (smoke test, canary): the rollout rolls back."""


@dataclass(frozen=True)
class PromotionTarget:
    """Where production lives: the served repository, its Triton, and optionally the gateway."""

    repository: Path
    triton_url: str
    records_dir: Path
    gateway: GatewayTraffic | None = None


@dataclass
class Rollout:
    """One model's move from version ``production`` to ``new`` on one Triton (and gateway)."""

    model: str
    production: int
    new: int
    target: PromotionTarget
    triton: TritonControl
    record: PromotionRecord
    policy: PromotionPolicy
    dependents: list[Dependent] = field(default_factory=list)
    log: Callable[[str], None] = print
    observer: StepObserver | None = None
    #: what the forward steps have begun to change (all of it, for a recovery: nobody knows)
    touched: set[str] = field(default_factory=set)

    def touch_everything(self) -> None:
        self.touched |= {"gateway", "triton", "repository"}

    # -- recording -------------------------------------------------------------------------------

    def _saved(self, entry: dict[str, Any]) -> None:
        self.record.write(self.target.records_dir)
        if self.observer is not None:
            self.observer(entry)

    def _attempt(self, name: str, action: Callable[[], Any], **details: Any) -> bool:
        """Run one step and record how it went; ``False`` when it raised (the error is recorded)."""
        try:
            action()
        except Exception as exc:
            self.log(f"{self.model}: {name}: FAILED ({type(exc).__name__}: {exc})")
            self._saved(
                self.record.step(name, ok=False, error=f"{type(exc).__name__}: {exc}", **details)
            )
            return False
        self._saved(self.record.step(name, ok=True, **details))
        return True

    def _must(self, name: str, action: Callable[[], Any], **details: Any) -> None:
        """A forward step: recorded, and its failure stops the rollout (its exception propagates)."""
        try:
            action()
        except Exception as exc:
            self._saved(
                self.record.step(name, ok=False, error=f"{type(exc).__name__}: {exc}", **details)
            )
            raise
        self._saved(self.record.step(name, ok=True, **details))

    @property
    def gateway(self) -> GatewayTraffic | None:
        return self.target.gateway

    def _judged(self, name: str, verdict: Outcome, failure: str) -> None:
        """Record a judged step with the figures it was judged on; a failed one fails the rollout
        (``failure``: what the exception's message names)."""
        self._saved(
            self.record.step(
                name, ok=verdict.passed, error=verdict.reason or None, **verdict.figures
            )
        )
        if not verdict.passed:
            raise RolloutFailed(f"{failure}: {verdict.reason}")

    # -- forward ---------------------------------------------------------------------------------

    def pin_production(self) -> None:
        """Traffic and ensembles on N before N+1 can be loaded."""
        self.touched |= {"gateway", "triton"}
        self._route_to(self.production, "N", "gateway: traffic pinned to N")

    def publish(self, candidate_dir: Path, report: BuildReport) -> None:
        """Copy the candidate's version folder (every file, sub-folders too) as N+1, marked unfinished."""
        files = {
            str(p.relative_to(candidate_dir)): p
            for p in sorted(candidate_dir.rglob("*"))
            if p.is_file() and p.name not in (REPORT_NAME, repo.UNFINISHED)
        }
        config = read_config(self.target.repository / self.model / "config.pbtxt")
        report.version = self.new

        self.touched.add("repository")

        def write() -> None:
            repo.publish(self.target.repository, config, files, report, unfinished=True)

        self._must("published unfinished", write, version=self.new, files=sorted(files))

    def load_side_by_side(self) -> None:
        self._must(
            "loaded side by side",
            lambda: self.triton.serve_versions(
                self.target.repository, self.model, [self.production, self.new]
            ),
            versions=[self.production, self.new],
        )

    def smoke_test(self, data: EvaluationData) -> None:
        """N+1, loaded under the production name, must pass the family's evaluation against N."""
        url = self.target.triton_url
        try:
            outcome = compare(
                data,
                infer_batch(url, self.model, str(self.production), data),
                infer_batch(url, self.model, str(self.new), data),
            )
        except Exception as exc:
            self._saved(
                self.record.step("smoke test", ok=False, error=f"{type(exc).__name__}: {exc}")
            )
            raise RolloutFailed(f"smoke test: version {self.new} did not answer: {exc}") from exc
        self._judged("smoke test", outcome, "smoke test")

    def canary(self) -> None:
        """A share of the model's traffic, and of each ensemble's, on N+1, watched in Triton's statistics."""
        if self.gateway is None:
            self._saved(
                self.record.step(
                    "canary skipped", ok=True, reason="no gateway to route a share of traffic"
                )
            )
            return
        gateway, share, new = self.gateway, self.policy.canary_share, self.new
        for dependent in self.dependents:
            config, files = dependent.canary(self.model, new)
            self._must(
                f"canary copy {dependent.canary_name} loaded",
                partial(self.triton.load_files, config, files),
                version=new,
            )
        routes = {self.model: (str(self.production), str(new))}
        routes |= {d.name: (str(d.version), model_target(d.canary_name)) for d in self.dependents}

        def route() -> None:
            for model, (production, canary) in routes.items():
                gateway.split(model, {production: 1 - share, canary: share})

        self._must(
            "canary",
            route,
            share=share,
            seconds=self.policy.canary_duration_s,
            ensembles=[d.name for d in self.dependents],
        )
        watch = CanaryWatch(gateway, routes)
        self.log(
            f"{self.model}: canary: {share:.0%} of traffic on version {new} (and through "
            f"{len(self.dependents)} ensemble copies) for at least {self.policy.canary_duration_s:g} s"
        )
        self._judged("canary watched", watch.wait(self.policy), "canary")

    def shift(self) -> None:
        """All traffic to N+1: the model's weights, then each ensemble (pinned to N+1, its canary
        share back)."""
        self._route_to(self.new, "N+1", "gateway: traffic on N+1", unpin=True)

    def _route_to(
        self, version: int, label: str, gateway_step: str, *, unpin: bool = False
    ) -> None:
        """The gateway's weights (step ``gateway_step``), then each ensemble, all on ``version``
        (``label`` in the step names); ``unpin``: each ensemble's gateway pin is cleared after it."""
        gateway = self.gateway
        if gateway is not None:
            self._must(
                gateway_step, lambda: gateway.split(self.model, {version: 1.0}), version=version
            )
        for dependent in self.dependents:
            config = dependent.pinned(self.model, version)
            self._must(
                f"ensemble {dependent.name} pinned to {label}",
                partial(self.triton.load_config, config),
                version=version,
            )
            if unpin and gateway is not None:
                self._must(
                    f"gateway: {dependent.name} unpinned", partial(gateway.clear, dependent.name)
                )

    def commit(self) -> None:
        self._must(
            "committed",
            lambda: repo.mark_finished(self.target.repository, self.model, self.new),
            version=self.new,
        )

    def retire(self) -> list[str]:
        """Clean-up after the commit: N and the canary copies unloaded, ensembles back to their
        repository configuration, weights cleared. Returns the steps that failed."""
        self._settle()
        steps: list[tuple[str, Callable[[], Any]]] = [
            (f"canary copy {d.canary_name} unloaded", partial(self._unload, d.canary_name))
            for d in self.dependents
        ]
        steps.append(
            (
                "N unloaded",
                lambda: self.triton.serve_versions(self.target.repository, self.model, [self.new]),
            )
        )
        steps += [
            (
                f"ensemble {d.name} back to its repository configuration",
                partial(self.triton.load_config, d.config),
            )
            for d in self.dependents
        ]
        if self.gateway is not None:
            gateway = self.gateway
            steps.append(("gateway weights cleared", lambda: gateway.clear(self.model)))
        return [name for name, action in steps if not self._attempt(f"retire: {name}", action)]

    # -- backward --------------------------------------------------------------------------------

    def rollback(self) -> list[str]:
        """Put back on N whatever the forward steps began to change; every step runs whatever the
        others did. Returns the steps that failed."""
        steps: list[tuple[str, Callable[[], Any]]] = []
        gateway = self.gateway if "gateway" in self.touched else None
        if gateway is not None:
            steps.append(
                (
                    "gateway traffic back on N",
                    lambda: gateway.split(self.model, {self.production: 1.0}),
                )
            )
            steps += [
                (f"gateway: {d.name} unpinned", partial(gateway.clear, d.name))
                for d in self.dependents
            ]
            steps.append(("weights settled", self._settle))
        if "triton" in self.touched:
            for d in self.dependents:
                steps.append(
                    (
                        f"ensemble {d.name} pinned to N",
                        partial(self.triton.load_config, d.pinned(self.model, self.production)),
                    )
                )
                steps.append(
                    (f"canary copy {d.canary_name} unloaded", partial(self._unload, d.canary_name))
                )
            steps.append(
                (
                    "N+1 unloaded",
                    lambda: self.triton.serve_versions(
                        self.target.repository, self.model, [self.production]
                    ),
                )
            )
        if "repository" in self.touched:
            steps.append(("N+1 removed from the repository", self._remove_new))
        if gateway is not None:
            steps.append(("gateway weights cleared", lambda: gateway.clear(self.model)))
        return [name for name, action in steps if not self._attempt(f"rollback: {name}", action)]

    def _remove_new(self) -> None:
        repo.discard_version(self.target.repository, self.model, self.new)

    def _unload(self, name: str) -> None:
        if self.triton.is_ready(name):
            self.triton.unload(name)

    def _settle(self) -> None:
        # Replicas that share weights through Redis apply a change within their sync interval; what
        # the old weights named must stay loaded until then.
        if self.gateway is not None and self.policy.settle_s > 0:
            time.sleep(self.policy.settle_s)
