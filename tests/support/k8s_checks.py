"""Invariant checks over the manifests in k8s/: schemas, probes, resources, exposure, network
policy, security context, selectors, references and namespaces.

Each ``check_*`` takes the rendered documents of one kustomization and returns a list of
violations (human-readable strings); an empty list means the invariant holds. The tests assert
that the real manifests give ``[]`` and that a deliberately broken copy does not, so every check
is shown able to fail.

Rendering and the document readers are in :mod:`tests.support.k8s_render`; the per-component
checks (Triton, gateway, Redis, images, GPU, observability) in :mod:`tests.support.k8s_workload_checks`.
:data:`CHECKS` names every check that runs on every kustomization.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate

from tests.support.k8s_render import (
    CLUSTER_SCOPED_KINDS,
    GATEWAY_LABELS,
    K8S,
    MONITORING_NAMESPACE,
    NAMESPACE,
    PUBLIC_SERVICES,
    REDIS_LABELS,
    TRITON_LABELS,
    TRITON_METRICS_PORT,
    containers,
    name_of,
    pod_labels,
    pod_spec,
    quantity,
    selects,
    workloads,
)

# REPO: tests/promote/test_promote_workflow.py imports it from here (the path it had before the split).
from tests.support.k8s_render import REPO as REPO
from tests.support.k8s_workload_checks import (
    check_gateway,
    check_images_from_kustomization,
    check_images_pinned,
    check_observability,
    check_redis,
    check_triton,
)

SCHEMAS = K8S / "schemas"
# Oldest Kubernetes minor we support; strict schemas reject unknown fields (typos).
K8S_VERSION = "1.30"

# CRDs kubernetes-validate has no schema for: validated against k8s/schemas/<kind>-<group>-<version>.json.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
}


# --- schema ----------------------------------------------------------------------------------


@cache
def _crd_validator(filename: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / filename).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def check_schema(docs: list[dict[str, Any]]) -> list[str]:
    """Core kinds against kubernetes-validate's strict schema, CRDs against k8s/schemas/."""
    errors = []
    for doc in docs:
        crd = CRD_KINDS.get((doc.get("apiVersion"), doc.get("kind")))
        if crd is not None:
            for error in _crd_validator(crd).iter_errors(doc):
                path = ".".join(str(p) for p in error.absolute_path)
                errors.append(f"{name_of(doc)}: {path}: {error.message}")
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{name_of(doc)}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            # Neither built in nor one of ours: unvalidated, so not allowed.
            errors.append(f"{name_of(doc)}: no schema: {exc.message}")
    return errors


# --- invariants ------------------------------------------------------------------------------


def _probe_action(probe: dict[str, Any]) -> object:
    """What a probe asks (its handler, without timings), to tell two probes apart."""
    return {k: probe[k] for k in ("httpGet", "exec", "tcpSocket", "grpc") if k in probe}


def check_probes(docs: list[dict[str, Any]]) -> list[str]:
    """Every container has liveness and readiness probes that ask different things (liveness: the
    process answers; readiness: it can serve), and a startupProbe where it has an HTTP liveness
    (an HTTP server's start must not count against liveness); init containers have none (not allowed)."""
    errors = []
    for w in workloads(docs):
        for kind, c in containers(w):
            if kind == "containers":
                for probe in ("livenessProbe", "readinessProbe"):
                    if probe not in c:
                        errors.append(f"{name_of(w)}: container {c['name']} has no {probe}")
                live, ready = c.get("livenessProbe"), c.get("readinessProbe")
                if live and ready and _probe_action(live) == _probe_action(ready):
                    errors.append(
                        f"{name_of(w)}: container {c['name']}'s liveness and readiness probes ask the same"
                    )
                if live and "httpGet" in live and "startupProbe" not in c:
                    errors.append(
                        f"{name_of(w)}: container {c['name']} has an HTTP livenessProbe but no startupProbe"
                    )
            else:
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    if probe in c:
                        errors.append(f"{name_of(w)}: init container {c['name']} has a {probe}")
    return errors


def check_resources(docs: list[dict[str, Any]]) -> list[str]:
    """Every container (init too) requests and limits cpu and memory, requests <= limits, and
    extended resources (nvidia.com/gpu) have requests equal to limits."""
    errors = []
    for w in workloads(docs):
        for _, c in containers(w):
            res = c.get("resources", {})
            requests, limits = res.get("requests", {}), res.get("limits", {})
            where = f"{name_of(w)}: container {c['name']}"
            for r in ("cpu", "memory"):
                if r not in requests:
                    errors.append(f"{where} has no {r} request")
                if r not in limits:
                    errors.append(f"{where} has no {r} limit")
                if (
                    r in requests
                    and r in limits
                    and quantity(r, requests[r]) > quantity(r, limits[r])
                ):
                    errors.append(f"{where}: {r} request {requests[r]} over limit {limits[r]}")
            for r in set(requests) | set(limits):
                if "/" in r and requests.get(r) != limits.get(r):
                    errors.append(
                        f"{where}: {r} request {requests.get(r)} != limit {limits.get(r)}"
                    )
    return errors


def check_exposure(docs: list[dict[str, Any]]) -> list[str]:
    """Only the gateway Service leaves the cluster: no other LoadBalancer/NodePort/external IPs,
    Ingress backends only the gateway, no host networking or host ports."""
    errors = []
    for doc in docs:
        if doc["kind"] == "Service":
            spec = doc["spec"]
            public = spec.get("type", "ClusterIP") in ("LoadBalancer", "NodePort") or spec.get(
                "externalIPs"
            )
            if doc["metadata"]["name"] not in PUBLIC_SERVICES:
                if public or spec.get("type") == "ExternalName":
                    errors.append(f"{name_of(doc)} is exposed (type {spec.get('type')})")
        elif doc["kind"] == "Ingress":
            backends = []
            spec = doc["spec"]
            if "defaultBackend" in spec:
                backends.append(spec["defaultBackend"])
            for rule in spec.get("rules", []):
                backends.extend(p["backend"] for p in rule.get("http", {}).get("paths", []))
            for b in backends:
                service = b.get("service", {}).get("name")
                if service not in PUBLIC_SERVICES:
                    errors.append(f"{name_of(doc)} routes to {service!r}")
    for w in workloads(docs):
        spec = pod_spec(w)
        if spec.get("hostNetwork"):
            errors.append(f"{name_of(w)} uses hostNetwork")
        for _, c in containers(w):
            for p in c.get("ports", []):
                if "hostPort" in p:
                    errors.append(
                        f"{name_of(w)}: container {c['name']} binds hostPort {p['hostPort']}"
                    )
    triton = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "triton"]
    if not triton or triton[0]["spec"].get("type", "ClusterIP") != "ClusterIP":
        errors.append("Service/triton must exist and be ClusterIP")
    return errors


def _policies_for(docs: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and (d["spec"]["podSelector"] == {} or selects(d["spec"]["podSelector"], labels))
    ]


def _rule_ports(rule: dict[str, Any]) -> set[int] | None:
    """The ports a rule opens (None: all ports)."""
    if not rule.get("ports"):
        return None
    return {p["port"] for p in rule["ports"]}


def check_network_policy(docs: list[dict[str, Any]]) -> list[str]:
    """Ingress is denied by default; Triton's inference ports open only to gateway pods, its metrics
    port only to the monitoring namespace; Redis only to gateway pods."""
    errors = []
    deny = [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"] == {}
        and "Ingress" in d["spec"].get("policyTypes", [])
        and not d["spec"].get("ingress")
    ]
    if not deny:
        errors.append(
            "no default-deny ingress NetworkPolicy (podSelector {} with no ingress rules)"
        )

    gateway_peer = {"podSelector": {"matchLabels": GATEWAY_LABELS}}
    monitoring_peer = {"namespaceSelector": {"matchLabels": MONITORING_NAMESPACE}}
    for target, labels, allowed in (
        (
            "triton",
            TRITON_LABELS,
            [(gateway_peer, {8000, 8001}), (monitoring_peer, {TRITON_METRICS_PORT})],
        ),
        ("redis", REDIS_LABELS, [(gateway_peer, {6379})]),
    ):
        policies = _policies_for(docs, labels)
        opened = False
        for policy in policies:
            if "Ingress" not in policy["spec"].get("policyTypes", ["Ingress"]):
                continue
            for rule in policy["spec"].get("ingress", []):
                opened = True
                ports = _rule_ports(rule)
                peers = rule.get("from")
                if not peers:
                    errors.append(f"{name_of(policy)} opens {target} to every source")
                    continue
                for peer in peers:
                    ok = [p for peer_ok, p in allowed if peer == peer_ok]
                    if not ok:
                        errors.append(f"{name_of(policy)} lets {peer} reach {target}")
                    elif ports is None or not ports <= ok[0]:
                        errors.append(
                            f"{name_of(policy)} lets {peer} reach {target} on ports {ports or 'all'}"
                        )
        if not opened:
            errors.append(f"no NetworkPolicy lets anything reach {target} (the gateway needs it)")
    return errors


def check_security_context(docs: list[dict[str, Any]]) -> list[str]:
    """Pods run as non-root with the RuntimeDefault seccomp profile; containers cannot escalate,
    drop all capabilities and have a read-only root filesystem; no service account token."""
    errors = []
    for w in workloads(docs):
        spec = pod_spec(w)
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            errors.append(f"{name_of(w)}: pod securityContext.runAsNonRoot is not true")
        if psc.get("runAsUser") == 0:
            errors.append(f"{name_of(w)}: runs as uid 0")
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            errors.append(f"{name_of(w)}: no RuntimeDefault seccomp profile")
        if spec.get("automountServiceAccountToken") is not False:
            errors.append(f"{name_of(w)}: mounts a service account token it does not need")
        for _, c in containers(w):
            sc = c.get("securityContext", {})
            where = f"{name_of(w)}: container {c['name']}"
            if sc.get("allowPrivilegeEscalation") is not False:
                errors.append(f"{where}: allowPrivilegeEscalation is not false")
            if sc.get("readOnlyRootFilesystem") is not True:
                errors.append(f"{where}: readOnlyRootFilesystem is not true")
            if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                errors.append(f"{where}: does not drop ALL capabilities")
            if sc.get("privileged") or sc.get("runAsUser") == 0:
                errors.append(f"{where}: privileged or root")
    return errors


def check_selectors(docs: list[dict[str, Any]]) -> list[str]:
    """Selectors meet the pods they mean: Deployments select their own template, Services select
    a workload and name ports it has, PDBs, HPAs and ScaledObjects each meet one workload, no
    workload has two autoscalers, and an autoscaled workload leaves `replicas` to its autoscaler."""
    errors = []
    ws = list(workloads(docs))
    by_name = {w["metadata"]["name"]: w for w in ws}
    for w in ws:
        if not selects(w["spec"]["selector"], pod_labels(w)):
            errors.append(f"{name_of(w)}: selector does not match its pod template labels")

    for svc in (d for d in docs if d["kind"] == "Service"):
        hits = [w for w in ws if selects(svc["spec"].get("selector"), pod_labels(w))]
        if len(hits) != 1:
            errors.append(f"{name_of(svc)} selects {len(hits)} workloads, expected 1")
            continue
        port_names = {
            p.get("name") for _, c in containers(hits[0], init=False) for p in c.get("ports", [])
        }
        port_numbers = {
            p["containerPort"]
            for _, c in containers(hits[0], init=False)
            for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in port_names | port_numbers:
                errors.append(
                    f"{name_of(svc)}: targetPort {target!r} is no container port of {name_of(hits[0])}"
                )

    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        hits = [w for w in ws if selects(pdb["spec"]["selector"], pod_labels(w))]
        if len(hits) != 1:
            errors.append(f"{name_of(pdb)} selects {len(hits)} workloads, expected 1")

    scaled: dict[str, list[str]] = {}
    for doc in docs:
        if doc["kind"] not in ("HorizontalPodAutoscaler", "ScaledObject"):
            continue
        ref = doc["spec"]["scaleTargetRef"]
        target = by_name.get(ref["name"])
        if target is None or ref.get("kind", "Deployment") != target["kind"]:
            errors.append(
                f"{name_of(doc)} targets {ref.get('kind')}/{ref['name']}, which does not exist"
            )
            continue
        scaled.setdefault(ref["name"], []).append(name_of(doc))
        if "replicas" in target["spec"]:
            errors.append(f"{name_of(target)} sets replicas although {name_of(doc)} owns the count")
        if doc["kind"] == "HorizontalPodAutoscaler":
            for metric in doc["spec"].get("metrics", []):
                if (
                    metric["type"] == "Resource"
                    and metric["resource"]["target"]["type"] == "Utilization"
                ):
                    resource = metric["resource"]["name"]
                    for _, c in containers(target, init=False):
                        if resource not in c.get("resources", {}).get("requests", {}):
                            errors.append(
                                f"{name_of(doc)}: {resource} utilisation needs a request on {c['name']}"
                            )
            if doc["spec"].get("minReplicas", 1) > doc["spec"]["maxReplicas"]:
                errors.append(f"{name_of(doc)}: minReplicas over maxReplicas")
        elif doc["spec"].get("minReplicaCount", 0) > doc["spec"].get("maxReplicaCount", 100):
            errors.append(f"{name_of(doc)}: minReplicaCount over maxReplicaCount")
    for workload, scalers in scaled.items():
        if len(scalers) > 1:
            errors.append(f"Deployment/{workload} has several autoscalers: {scalers}")

    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        svcs = [
            d
            for d in docs
            if d["kind"] == "Service"
            and selects(sm["spec"]["selector"], d["metadata"].get("labels", {}))
        ]
        if len(svcs) != 1:
            errors.append(f"{name_of(sm)} selects {len(svcs)} Services, expected 1")
            continue
        names = {p.get("name") for p in svcs[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep["port"] not in names:
                errors.append(
                    f"{name_of(sm)}: port {ep['port']!r} is not a named port of {name_of(svcs[0])}"
                )

    for np in (d for d in docs if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"] != {}):
        if not any(selects(np["spec"]["podSelector"], pod_labels(w)) for w in ws):
            errors.append(f"{name_of(np)} selects no pods")
    return errors


def check_references(docs: list[dict[str, Any]]) -> list[str]:
    """Every ConfigMap, Secret (and key) and PVC a pod refers to is rendered, unless optional;
    every volumeMount names a volume."""
    errors = []
    present = {(d["kind"], d["metadata"]["name"]): d for d in docs}

    def has_key(kind: str, name: str, key: str) -> bool:
        doc = present.get((kind, name))
        return doc is not None and key in {**doc.get("data", {}), **doc.get("stringData", {})}

    for w in workloads(docs):
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if (
                "persistentVolumeClaim" in v
                and ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
                not in present
            ):
                errors.append(f"{name_of(w)}: volume {v['name']} claims a PVC that does not exist")
            if "secret" in v and ("Secret", v["secret"]["secretName"]) not in present:
                errors.append(f"{name_of(w)}: volume {v['name']} uses a Secret that does not exist")
            if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) not in present:
                errors.append(
                    f"{name_of(w)}: volume {v['name']} uses a ConfigMap that does not exist"
                )
        for _, c in containers(w):
            where = f"{name_of(w)}: container {c['name']}"
            for mount in c.get("volumeMounts", []):
                if mount["name"] not in volumes and mount["name"] not in claims:
                    errors.append(f"{where} mounts unknown volume {mount['name']!r}")
            for env in c.get("env", []):
                source = env.get("valueFrom", {})
                for ref_kind, kind in (
                    ("configMapKeyRef", "ConfigMap"),
                    ("secretKeyRef", "Secret"),
                ):
                    ref = source.get(ref_kind)
                    if (
                        ref
                        and not ref.get("optional")
                        and not has_key(kind, ref["name"], ref["key"])
                    ):
                        errors.append(
                            f"{where}: env {env['name']} needs {kind}/{ref['name']} key {ref['key']}"
                        )
            for env_from in c.get("envFrom", []):
                for ref_kind, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
                    ref = env_from.get(ref_kind)
                    if ref and not ref.get("optional") and (kind, ref["name"]) not in present:
                        errors.append(f"{where}: envFrom needs {kind}/{ref['name']}")
    return errors


def check_namespace(docs: list[dict[str, Any]]) -> list[str]:
    """Everything namespaced lives in the platform's namespace, which the kustomization creates."""
    errors = []
    if not any(d["kind"] == "Namespace" and d["metadata"]["name"] == NAMESPACE for d in docs):
        errors.append(f"Namespace/{NAMESPACE} is not rendered")
    for doc in docs:
        if (
            doc["kind"] not in CLUSTER_SCOPED_KINDS
            and doc["metadata"].get("namespace") != NAMESPACE
        ):
            errors.append(
                f"{name_of(doc)} is in namespace {doc['metadata'].get('namespace')!r}, not {NAMESPACE!r}"
            )
    return errors


CHECKS = {
    "schema": check_schema,
    "probes": check_probes,
    "resources": check_resources,
    "images_pinned": check_images_pinned,
    "exposure": check_exposure,
    "network_policy": check_network_policy,
    "security_context": check_security_context,
    "selectors": check_selectors,
    "references": check_references,
    "namespace": check_namespace,
    "triton": check_triton,
    "gateway": check_gateway,
    "redis": check_redis,
    "images_from_kustomization": check_images_from_kustomization,
    "observability": check_observability,
}
