"""Rendering and invariant checks over the manifests in k8s/.

Each ``check_*`` takes the rendered documents of one kustomization and returns a list of
violations (human-readable strings); an empty list means the invariant holds. The tests assert
that the real manifests give ``[]`` and that a deliberately broken copy does not, so every check
is shown able to fail.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
SCHEMAS = K8S / "schemas"
KUSTOMIZATIONS = ["base", "overlays/rtx4090", "overlays/rtx4090-pvc"]
GPU_KUSTOMIZATIONS = ["overlays/rtx4090", "overlays/rtx4090-pvc"]
# Oldest Kubernetes minor we support; strict schemas reject unknown fields (typos).
K8S_VERSION = "1.30"
NAMESPACE = "inference"

GATEWAY_LABELS = {"app.kubernetes.io/name": "gateway"}
TRITON_LABELS = {"app.kubernetes.io/name": "triton"}
REDIS_LABELS = {"app.kubernetes.io/name": "redis"}
MONITORING_NAMESPACE = {"kubernetes.io/metadata.name": "monitoring"}
TRITON_METRICS_PORT = 8002
PUBLIC_SERVICES = {"gateway"}

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
# CRDs kubernetes-validate has no schema for: validated against k8s/schemas/<kind>-<group>-<version>.json.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
}


def _load_render_module() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_render", K8S / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_module = _load_render_module()


@cache
def _rendered_json(kustomization: str) -> str:
    return json.dumps(render_module.render(K8S / kustomization, example_secrets=True))


def rendered(kustomization: str) -> list[dict[str, Any]]:
    """A fresh (mutable) copy of the rendered documents; rendering itself is cached."""
    return json.loads(_rendered_json(kustomization))


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


def containers(workload: dict[str, Any], *, init: bool = True) -> Iterator[tuple[str, dict[str, Any]]]:
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
_MEMORY_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


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


def check_probes(docs: list[dict[str, Any]]) -> list[str]:
    """Every container has liveness and readiness probes; init containers have none (not allowed)."""
    errors = []
    for w in workloads(docs):
        for kind, c in containers(w):
            if kind == "containers":
                for probe in ("livenessProbe", "readinessProbe"):
                    if probe not in c:
                        errors.append(f"{name_of(w)}: container {c['name']} has no {probe}")
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
                if r in requests and r in limits and quantity(r, requests[r]) > quantity(r, limits[r]):
                    errors.append(f"{where}: {r} request {requests[r]} over limit {limits[r]}")
            for r in set(requests) | set(limits):
                if "/" in r and requests.get(r) != limits.get(r):
                    errors.append(f"{where}: {r} request {requests.get(r)} != limit {limits.get(r)}")
    return errors


# name[:tag][@sha256:digest]; the tag must carry a version number.
_IMAGE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@sha256:(?P<digest>[0-9a-f]{64}))?$")


def check_images_pinned(docs: list[dict[str, Any]]) -> list[str]:
    """Every image is pinned: a digest, or a tag that names a version (has a digit), never latest."""
    errors = []
    for w in workloads(docs):
        for _, c in containers(w):
            image = c.get("image", "")
            m = _IMAGE.match(image)
            where = f"{name_of(w)}: container {c['name']} image {image!r}"
            if not m:
                errors.append(f"{where} is not a valid image reference")
                continue
            tag, digest = m.group("tag"), m.group("digest")
            if digest:
                continue
            if tag is None:
                errors.append(f"{where} has no tag (means latest)")
            elif tag == "latest" or "latest" in tag.split("-") or not re.search(r"\d", tag):
                errors.append(f"{where} uses a moving tag {tag!r}")
            if c.get("imagePullPolicy") == "Always" and not digest:
                errors.append(f"{where}: imagePullPolicy Always with a tag suggests it is not pinned")
    return errors


def check_exposure(docs: list[dict[str, Any]]) -> list[str]:
    """Only the gateway Service leaves the cluster: no other LoadBalancer/NodePort/external IPs,
    Ingress backends only the gateway, no host networking or host ports."""
    errors = []
    for doc in docs:
        if doc["kind"] == "Service":
            spec = doc["spec"]
            public = spec.get("type", "ClusterIP") in ("LoadBalancer", "NodePort") or spec.get("externalIPs")
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
                    errors.append(f"{name_of(w)}: container {c['name']} binds hostPort {p['hostPort']}")
    triton = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "triton"]
    if not triton or triton[0]["spec"].get("type", "ClusterIP") != "ClusterIP":
        errors.append("Service/triton must exist and be ClusterIP")
    return errors


def _policies_for(docs: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"
            and (d["spec"]["podSelector"] == {} or selects(d["spec"]["podSelector"], labels))]


def _rule_ports(rule: dict[str, Any]) -> set[int] | None:
    """The ports a rule opens (None: all ports)."""
    if not rule.get("ports"):
        return None
    return {p["port"] for p in rule["ports"]}


def check_network_policy(docs: list[dict[str, Any]]) -> list[str]:
    """Ingress is denied by default; Triton's inference ports open only to gateway pods, its metrics
    port only to the monitoring namespace; Redis only to gateway pods."""
    errors = []
    deny = [d for d in docs if d["kind"] == "NetworkPolicy" and d["spec"]["podSelector"] == {}
            and "Ingress" in d["spec"].get("policyTypes", []) and not d["spec"].get("ingress")]
    if not deny:
        errors.append("no default-deny ingress NetworkPolicy (podSelector {} with no ingress rules)")

    gateway_peer = {"podSelector": {"matchLabels": GATEWAY_LABELS}}
    monitoring_peer = {"namespaceSelector": {"matchLabels": MONITORING_NAMESPACE}}
    for target, labels, allowed in (
        ("triton", TRITON_LABELS, [(gateway_peer, {8000, 8001}), (monitoring_peer, {TRITON_METRICS_PORT})]),
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
                        errors.append(f"{name_of(policy)} lets {peer} reach {target} on ports {ports or 'all'}")
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
        port_names = {p.get("name") for _, c in containers(hits[0], init=False) for p in c.get("ports", [])}
        port_numbers = {p["containerPort"] for _, c in containers(hits[0], init=False) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in port_names | port_numbers:
                errors.append(f"{name_of(svc)}: targetPort {target!r} is no container port of {name_of(hits[0])}")

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
            errors.append(f"{name_of(doc)} targets {ref.get('kind')}/{ref['name']}, which does not exist")
            continue
        scaled.setdefault(ref["name"], []).append(name_of(doc))
        if "replicas" in target["spec"]:
            errors.append(f"{name_of(target)} sets replicas although {name_of(doc)} owns the count")
        if doc["kind"] == "HorizontalPodAutoscaler":
            for metric in doc["spec"].get("metrics", []):
                if metric["type"] == "Resource" and metric["resource"]["target"]["type"] == "Utilization":
                    resource = metric["resource"]["name"]
                    for _, c in containers(target, init=False):
                        if resource not in c.get("resources", {}).get("requests", {}):
                            errors.append(f"{name_of(doc)}: {resource} utilisation needs a request on {c['name']}")
            if doc["spec"].get("minReplicas", 1) > doc["spec"]["maxReplicas"]:
                errors.append(f"{name_of(doc)}: minReplicas over maxReplicas")
        elif doc["spec"].get("minReplicaCount", 0) > doc["spec"].get("maxReplicaCount", 100):
            errors.append(f"{name_of(doc)}: minReplicaCount over maxReplicaCount")
    for workload, scalers in scaled.items():
        if len(scalers) > 1:
            errors.append(f"Deployment/{workload} has several autoscalers: {scalers}")

    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        svcs = [d for d in docs if d["kind"] == "Service" and selects(sm["spec"]["selector"], d["metadata"].get("labels", {}))]
        if len(svcs) != 1:
            errors.append(f"{name_of(sm)} selects {len(svcs)} Services, expected 1")
            continue
        names = {p.get("name") for p in svcs[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep["port"] not in names:
                errors.append(f"{name_of(sm)}: port {ep['port']!r} is not a named port of {name_of(svcs[0])}")

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
        for v in volumes.values():
            if "persistentVolumeClaim" in v and ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) not in present:
                errors.append(f"{name_of(w)}: volume {v['name']} claims a PVC that does not exist")
            if "secret" in v and ("Secret", v["secret"]["secretName"]) not in present:
                errors.append(f"{name_of(w)}: volume {v['name']} uses a Secret that does not exist")
            if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) not in present:
                errors.append(f"{name_of(w)}: volume {v['name']} uses a ConfigMap that does not exist")
        for _, c in containers(w):
            where = f"{name_of(w)}: container {c['name']}"
            for mount in c.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    errors.append(f"{where} mounts unknown volume {mount['name']!r}")
            for env in c.get("env", []):
                source = env.get("valueFrom", {})
                for ref_kind, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                    ref = source.get(ref_kind)
                    if ref and not ref.get("optional") and not has_key(kind, ref["name"], ref["key"]):
                        errors.append(f"{where}: env {env['name']} needs {kind}/{ref['name']} key {ref['key']}")
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
        if doc["kind"] not in CLUSTER_SCOPED_KINDS and doc["metadata"].get("namespace") != NAMESPACE:
            errors.append(f"{name_of(doc)} is in namespace {doc['metadata'].get('namespace')!r}, not {NAMESPACE!r}")
    return errors


def check_triton(docs: list[dict[str, Any]]) -> list[str]:
    """Triton: the pinned NGC image, explicit model control, strict readiness, probes on the v2
    health endpoints and a startupProbe long enough for model loads."""
    errors = []
    triton = find(docs, "Deployment", "triton")
    (c,) = [c for _, c in containers(triton, init=False) if c["name"] == "triton"]
    if c["image"].split("@")[0] != "nvcr.io/nvidia/tritonserver:24.10-py3":
        errors.append(f"triton image {c['image']!r} is not the 24.10-py3 (Triton 2.51.0) release")
    args = c.get("args", [])
    for required in ("--model-repository=/models", "--model-control-mode=explicit", "--strict-readiness=true"):
        if required not in args:
            errors.append(f"triton args lack {required}")
    if not any(a.startswith("--load-model=") for a in args):
        errors.append("triton loads no model at start (--load-model)")
    expected = {"livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready",
                "startupProbe": "/v2/health/ready"}
    for probe, path in expected.items():
        got = c.get(probe, {}).get("httpGet", {}).get("path")
        if got != path:
            errors.append(f"triton {probe} path is {got!r}, expected {path!r}")
    startup = c.get("startupProbe", {})
    if startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) < 300:
        errors.append("triton startupProbe allows under 5 minutes for model loads")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if ports != {"http": 8000, "grpc": 8001, "metrics": 8002}:
        errors.append(f"triton ports are {ports}")
    return errors


def check_gateway(docs: list[dict[str, Any]]) -> list[str]:
    """Gateway: the env it reads, secrets from a Secret (never a literal), health endpoints."""
    errors = []
    gateway = find(docs, "Deployment", "gateway")
    (c,) = [c for _, c in containers(gateway, init=False) if c["name"] == "gateway"]
    env = {e["name"]: e for e in c.get("env", [])}
    expected = {"GATEWAY_TRITON_HTTP_URL": "triton:8000", "GATEWAY_REDIS_URL": "redis://redis:6379/0",
                "GATEWAY_KEYS_DB": "/var/lib/gateway/keys.sqlite"}
    for name, value in expected.items():
        if env.get(name, {}).get("value") != value:
            errors.append(f"gateway env {name} is not {value!r}")
    for name in ("GATEWAY_ADMIN_TOKEN", "GATEWAY_JWT_SECRET"):
        if "secretKeyRef" not in env.get(name, {}).get("valueFrom", {}):
            errors.append(f"gateway env {name} does not come from a Secret")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        errors.append("gateway livenessProbe is not /healthz")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        errors.append("gateway readinessProbe is not /readyz")
    return errors


def check_gpu(docs: list[dict[str, Any]]) -> list[str]:
    """GPU overlays: Triton gets one GPU, lands on RTX 4090 nodes, tolerates their taint."""
    errors = []
    triton = find(docs, "Deployment", "triton")
    spec = pod_spec(triton)
    (c,) = [c for _, c in containers(triton, init=False) if c["name"] == "triton"]
    res = c["resources"]
    if res.get("limits", {}).get("nvidia.com/gpu") != "1" or res.get("requests", {}).get("nvidia.com/gpu") != "1":
        errors.append("triton does not request and limit nvidia.com/gpu: 1")
    if spec.get("nodeSelector", {}).get("nvidia.com/gpu.product") != "NVIDIA-GeForce-RTX-4090":
        errors.append("triton is not pinned to RTX 4090 nodes")
    if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
        errors.append("triton does not tolerate the nvidia.com/gpu taint")
    if find(docs, "ConfigMap", "model-repository")["data"]["MODEL_REPOSITORY_PREFIX"] != "model_repository/rtx4090":
        errors.append("the model repository prefix is not the RTX 4090 (TensorRT) set")
    for w in workloads(docs):
        if w["metadata"]["name"] != "triton" and any(
            "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for _, c in containers(w)
        ):
            errors.append(f"{name_of(w)} takes a GPU it does not need")
    return errors


def check_cpu_only(docs: list[dict[str, Any]]) -> list[str]:
    """The base runs on any node: no GPU resources, no GPU node selector."""
    errors = []
    for w in workloads(docs):
        if pod_spec(w).get("nodeSelector") or pod_spec(w).get("tolerations"):
            errors.append(f"{name_of(w)} constrains scheduling in the base")
        for _, c in containers(w):
            if any("nvidia.com" in r for part in c.get("resources", {}).values() for r in part):
                errors.append(f"{name_of(w)}: container {c['name']} asks for a GPU in the base")
    return errors


_QUEUE_QUERY = re.compile(
    r"sum\(rate\(nv_inference_queue_duration_us(\{[^}]*\})?\[1m\]\)\)\s*/\s*\(?\s*sum\(rate\(nv_inference_request_success(\{[^}]*\})?\[1m\]\)\)"
)
_P99 = re.compile(
    r"histogram_quantile\(0\.99,\s*sum by \(le, model\) \(rate\(gateway_request_duration_seconds_bucket\[5m\]\)\)\)"
)


def check_observability(docs: list[dict[str, Any]]) -> list[str]:
    """KEDA scales Triton on request-weighted queue time (server#8979) as a Value metric; an alert
    fires on the gateway's aggregatable P99 over the SLO; both Deployments are scraped."""
    errors = []
    scaled = [d for d in docs if d["kind"] == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == "triton"]
    if len(scaled) != 1:
        errors.append("no ScaledObject for triton")
    else:
        for trigger in scaled[0]["spec"]["triggers"]:
            query = " ".join(trigger["metadata"].get("query", "").split())
            if not _QUEUE_QUERY.search(query):
                errors.append(f"KEDA query is not request-weighted queue time: {query!r}")
            if trigger.get("metricType") != "Value":
                errors.append("KEDA trigger must use metricType Value (the query is already a ratio)")
    rules = [r for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"] for r in g["rules"]]
    records = {r["record"]: " ".join(r["expr"].split()) for r in rules if "record" in r}

    def expand(expr: str) -> str:
        for name, body in records.items():
            expr = expr.replace(name, body)
        return " ".join(expr.split())

    p99_alerts = [r for r in rules if "alert" in r and _P99.search(expand(r["expr"]))
                  and re.search(r">\s*[0-9.]+$", expand(r["expr"]))]
    if not p99_alerts:
        errors.append("no alert on histogram_quantile(0.99, ...gateway_request_duration_seconds_bucket...) > SLO")
    monitored = {d["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") for d in docs if d["kind"] == "ServiceMonitor"}
    for app in ("gateway", "triton"):
        if app not in monitored:
            errors.append(f"no ServiceMonitor scrapes {app}")
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
    "observability": check_observability,
}
