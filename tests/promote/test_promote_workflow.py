""".github/workflows/promote.yml: parses, triggers as specified, and its gates cannot be skipped."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.support.k8s_checks import REPO

WORKFLOW = REPO / ".github" / "workflows" / "promote.yml"
PROMOTE_JOB = "promote"
# In order; each must be its own step whose `run` contains the command.
REQUIRED_STEPS: list[tuple[str, str]] = [
    ("test", "./run test"),
    ("build", 'inferctl build "$MODEL"'),
    ("parity", 'inferctl promote "$MODEL" --candidate "$CANDIDATE" --gate parity'),
    ("accuracy", 'inferctl promote "$MODEL" --candidate "$CANDIDATE" --gate accuracy'),
    ("latency", 'inferctl promote "$MODEL" --candidate "$CANDIDATE" --gate latency'),
    ("publish", 'inferctl promote "$MODEL" --candidate "$CANDIDATE" --publish'),
]
_PINNED_ACTION = re.compile(r"^[\w.-]+/[\w./-]+@(v\d+(\.\d+)*|[0-9a-f]{40})$")


def load() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


def triggers(doc: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as the boolean True.
    return doc.get("on", doc.get(True)) or {}


def violations(doc: dict[str, Any]) -> list[str]:
    """Every way the workflow could let a candidate through without passing all gates."""
    errors = []
    job = doc["jobs"].get(PROMOTE_JOB)
    if job is None:
        return [f"no job {PROMOTE_JOB!r}"]
    if job.get("continue-on-error"):
        errors.append("the promote job has continue-on-error")
    if job.get("strategy", {}).get("matrix", {}).get("continue-on-error"):
        errors.append("the promote matrix has continue-on-error")
    steps = job.get("steps", [])
    positions = []
    for gate, command in REQUIRED_STEPS:
        hits = [i for i, s in enumerate(steps) if command in s.get("run", "")]
        if len(hits) != 1:
            errors.append(f"step {gate!r} ({command}) appears {len(hits)} times, expected once")
            continue
        step = steps[hits[0]]
        positions.append(hits[0])
        if step.get("continue-on-error") not in (None, False):
            errors.append(f"step {gate!r} has continue-on-error: {step['continue-on-error']}")
        # Any condition can skip a gate (or run publish after a failure, as always() does).
        if "if" in step:
            errors.append(f"step {gate!r} is conditional: if: {step['if']}")
        for other in REQUIRED_STEPS:
            if other[0] != gate and other[1] in step.get("run", ""):
                errors.append(f"step {gate!r} also runs {other[0]!r}: gates must be separate steps")
        if re.search(r"\|\|\s*true|;\s*true\s*$|set \+e", step.get("run", "")):
            errors.append(f"step {gate!r} swallows its exit status")
    if positions != sorted(positions):
        errors.append(
            "required steps are out of order (test, build, parity, accuracy, latency, publish)"
        )
    for s in steps:
        if "uses" in s and not _PINNED_ACTION.match(s["uses"]):
            errors.append(f"action {s['uses']!r} is not pinned to a version")
    return errors


def test_workflow_parses_and_names_its_triggers() -> None:
    doc = load()
    on = triggers(doc)
    inputs = on["workflow_dispatch"]["inputs"]
    assert {"model", "candidate"} <= set(inputs)
    assert all(inputs[name]["required"] is True for name in ("model", "candidate"))
    assert "builders/families/**" in on["push"]["paths"]
    assert doc["permissions"] == {"contents": "read"}


def test_gates_are_required_separate_ordered_steps() -> None:
    assert violations(load()) == []


def test_inputs_reach_shell_only_through_env() -> None:
    """`${{ inputs.* }}` inside `run:` is shell injection; inputs travel through env instead."""
    doc = load()
    for job in doc["jobs"].values():
        for step in job.get("steps", []):
            assert "${{" not in step.get("run", ""), step


def test_every_job_has_a_timeout() -> None:
    assert all("timeout-minutes" in job for job in load()["jobs"].values())


def _step(doc: dict[str, Any], command: str) -> dict[str, Any]:
    return next(s for s in doc["jobs"][PROMOTE_JOB]["steps"] if command in s.get("run", ""))


def _mutations() -> list[tuple[str, Callable[[dict[str, Any]], None], str]]:
    latency = REQUIRED_STEPS[4][1]
    publish = REQUIRED_STEPS[5][1]

    def soft_gate(doc: dict[str, Any]) -> None:
        _step(doc, latency)["continue-on-error"] = True

    def soft_job(doc: dict[str, Any]) -> None:
        doc["jobs"][PROMOTE_JOB]["continue-on-error"] = True

    def always_publish(doc: dict[str, Any]) -> None:
        _step(doc, publish)["if"] = "always()"

    def drop_accuracy(doc: dict[str, Any]) -> None:
        steps = doc["jobs"][PROMOTE_JOB]["steps"]
        steps.remove(_step(doc, REQUIRED_STEPS[3][1]))

    def merged_gates(doc: dict[str, Any]) -> None:
        _step(doc, latency)["run"] += "\n" + REQUIRED_STEPS[3][1]

    def publish_first(doc: dict[str, Any]) -> None:
        steps = doc["jobs"][PROMOTE_JOB]["steps"]
        step = _step(doc, publish)
        steps.remove(step)
        steps.insert(1, step)

    def swallowed(doc: dict[str, Any]) -> None:
        _step(doc, latency)["run"] += " || true"

    def unpinned(doc: dict[str, Any]) -> None:
        doc["jobs"][PROMOTE_JOB]["steps"][0]["uses"] = "actions/checkout@main"

    return [
        ("soft_gate", soft_gate, "continue-on-error"),
        ("soft_job", soft_job, "promote job has continue-on-error"),
        ("always_publish", always_publish, "'publish' is conditional"),
        ("drop_accuracy", drop_accuracy, "'accuracy'"),
        ("merged_gates", merged_gates, "must be separate steps"),
        ("publish_first", publish_first, "out of order"),
        ("swallowed", swallowed, "swallows its exit status"),
        ("unpinned", unpinned, "not pinned"),
    ]


@pytest.mark.parametrize(
    ("name", "mutate", "expected"), _mutations(), ids=[m[0] for m in _mutations()]
)
def test_violations_catch(
    name: str, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    doc = copy.deepcopy(load())
    mutate(doc)
    assert any(expected in e for e in violations(doc)), violations(doc)


def _words(step: dict[str, Any]) -> list[str]:
    return shlex.split(step["run"].replace("\n", " "))


def _option(words: list[str], option: str) -> str:
    (value,) = [words[i + 1] for i, word in enumerate(words) if word == option]
    return value


def _resolved(value: str, env: dict[str, Any]) -> str:
    """``$NAME`` through the job's env; anything else as written."""
    return str(env[value[1:]]) if value.startswith("$") else value


def test_every_promote_step_reads_the_candidate_the_build_wrote_and_names_production() -> None:
    """The candidate is a repository path (what `inferctl build --repository` wrote), never a commit id;
    every gate and the publish name the served repository, its Triton and the kept records."""
    job = load()["jobs"][PROMOTE_JOB]
    env = job["env"]
    build = _words(_step(load(), REQUIRED_STEPS[1][1]))
    written = _resolved(_option(build, "--repository"), env)
    assert "${{" not in written and written == "candidates"
    for _, command in REQUIRED_STEPS[2:]:
        words = _words(_step(load(), command))
        assert _resolved(_option(words, "--candidate"), env) == written
        assert _option(words, "--repository") == "$SERVED_REPOSITORY"
        assert _option(words, "--triton-url") == "$TRITON_URL"
        assert _option(words, "--records-dir") == "$RECORDS"
    publish = _step(load(), REQUIRED_STEPS[5][1])
    assert _option(_words(publish), "--gateway-url") == "$GATEWAY_URL"
    # It publishes where it says: the served repository and the gateway; no other store's credentials.
    assert set(publish.get("env", {})) == {"GATEWAY_ADMIN_TOKEN"}
    for name in ("SERVED_REPOSITORY", "TRITON_URL", "GATEWAY_URL", "RECORDS"):
        assert str(env[name]).startswith("${{ vars."), name
    # The candidate is checked out from the ref asked for (a commit on a push), and built from it.
    assert job["steps"][0]["with"]["ref"] == "${{ inputs.candidate || github.sha }}"


def test_a_push_promotes_the_networks_the_default_models_serve() -> None:
    """The plan job reads DEFAULT_NETWORKS without importing anything; pipelines are never promoted, the
    networks they call are, and the literal says exactly which."""
    from builders.registry import DEFAULT_MODELS, DEFAULT_NETWORKS, resolve
    from builders.spec import ModelSpec

    assert set(DEFAULT_NETWORKS) == {
        s.name for s in resolve(DEFAULT_MODELS) if isinstance(s, ModelSpec)
    }
    plan = next(s for s in load()["jobs"]["plan"]["steps"] if s.get("id") == "models")["run"]
    script = plan[plan.index("<<'EOF'\n") + len("<<'EOF'\n") : plan.index("\nEOF\n")]
    output = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(output) == list(DEFAULT_NETWORKS)
