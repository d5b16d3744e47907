"""Per-component checks over the rendered manifests: Triton, the gateway, Redis, the platform's
images (pinned, and tagged as the kustomization says), the GPU and CPU-only overlays, and
observability.

Same contract as :mod:`tests.support.k8s_checks`: each ``check_*`` returns its violations, ``[]``
when the invariant holds.
"""

from __future__ import annotations

import re
from typing import Any

from tests.support.k8s_render import (
    IMAGE_PREFIX,
    PLACEHOLDER_REGISTRIES,
    TRITON_READINESS_SCRIPT,
    containers,
    find,
    name_of,
    pod_spec,
    project_version,
    quantity,
    workloads,
)

# name[:tag][@sha256:digest]; the tag must carry a version number.
_IMAGE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9._/:-]*?)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@sha256:(?P<digest>[0-9a-f]{64}))?$"
)


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
                errors.append(
                    f"{where}: imagePullPolicy Always with a tag suggests it is not pinned"
                )
    return errors


def check_triton(docs: list[dict[str, Any]]) -> list[str]:
    """Triton: the platform's image, explicit model control, strict readiness, liveness and startup on
    the v2 health endpoints (a startupProbe long enough for model loads), readiness on every model of
    the served-models list (the model_readiness.py probe, which the Triton image carries)."""
    errors = []
    triton = find(docs, "Deployment", "triton")
    (c,) = [c for _, c in containers(triton, init=False) if c["name"] == "triton"]
    if c["image"].split("@")[0].split(":")[0] != f"{IMAGE_PREFIX}triton":
        errors.append(
            f"triton image {c['image']!r} is not the platform's Triton image (docker/triton.Dockerfile)"
        )
    args = c.get("args", [])
    for required in (
        "--model-repository=/models",
        "--model-control-mode=explicit",
        "--strict-readiness=true",
    ):
        if required not in args:
            errors.append(f"triton args lack {required}")
    if not any(a.startswith("--load-model=") for a in args):
        errors.append("triton loads no model at start (--load-model)")
    expected = {"livenessProbe": "/v2/health/live", "startupProbe": "/v2/health/ready"}
    for probe, path in expected.items():
        got = c.get(probe, {}).get("httpGet", {}).get("path")
        if got != path:
            errors.append(f"triton {probe} path is {got!r}, expected {path!r}")
    command = c.get("readinessProbe", {}).get("exec", {}).get("command", [])
    if command[:2] != ["python3", TRITON_READINESS_SCRIPT]:
        errors.append(
            f"triton readinessProbe does not run {TRITON_READINESS_SCRIPT} (the per-model probe): {command}"
        )
    ref = (
        {e["name"]: e for e in c.get("env", [])}.get("READY_MODELS", {})
        .get("valueFrom", {})
        .get("configMapKeyRef", {})
    )
    if (ref.get("name"), ref.get("key")) != ("served-models", "READY_MODELS"):
        errors.append("triton env READY_MODELS does not come from ConfigMap served-models")
    startup = c.get("startupProbe", {})
    if startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) < 300:
        errors.append("triton startupProbe allows under 5 minutes for model loads")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if ports != {"http": 8000, "grpc": 8001, "metrics": 8002}:
        errors.append(f"triton ports are {ports}")
    return errors


def check_gateway(docs: list[dict[str, Any]]) -> list[str]:
    """Gateway: the env it reads, secrets from a Secret (never a literal), health endpoints, the gRPC
    entry on a container port the Service and the NetworkPolicy open, workers within its CPU limit,
    readiness on the served-models list."""
    errors = []
    gateway = find(docs, "Deployment", "gateway")
    (c,) = [c for _, c in containers(gateway, init=False) if c["name"] == "gateway"]
    env = {e["name"]: e for e in c.get("env", [])}
    expected = {
        "GATEWAY_TRITON_HTTP_URL": "triton:8000",
        "GATEWAY_REDIS_URL": "redis://redis:6379/0",
        "GATEWAY_KEYS_DB": "/var/lib/gateway/keys.sqlite",
    }
    for name, value in expected.items():
        if env.get(name, {}).get("value") != value:
            errors.append(f"gateway env {name} is not {value!r}")
    for name in ("GATEWAY_ADMIN_TOKEN", "GATEWAY_JWT_SECRET", "GATEWAY_METRICS_TOKEN"):
        if "secretKeyRef" not in env.get(name, {}).get("valueFrom", {}):
            errors.append(f"gateway env {name} does not come from a Secret")
    ref = env.get("GATEWAY_READY_MODELS", {}).get("valueFrom", {}).get("configMapKeyRef", {})
    if (ref.get("name"), ref.get("key")) != ("served-models", "READY_MODELS"):
        errors.append("gateway env GATEWAY_READY_MODELS does not come from ConfigMap served-models")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        errors.append("gateway livenessProbe is not /healthz")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        errors.append("gateway readinessProbe is not /readyz")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    grpc_port = env.get("GATEWAY_GRPC_PORT", {}).get("value")
    if grpc_port is None or ports.get("grpc") != int(grpc_port):
        errors.append(
            f"gateway GATEWAY_GRPC_PORT {grpc_port!r} is not its grpc container port {ports.get('grpc')}"
        )
    service_targets = {
        p.get("targetPort") for p in find(docs, "Service", "gateway")["spec"]["ports"]
    }
    if not {"http", "grpc"} <= service_targets:
        errors.append(
            "Service/gateway does not expose both http and grpc "
            f"(targets {sorted(map(str, service_targets))})"
        )
    opened = {
        p["port"]
        for rule in find(docs, "NetworkPolicy", "gateway-ingress")["spec"].get("ingress", [])
        for p in rule.get("ports", [])
    }
    if opened != set(ports.values()):
        errors.append(
            f"NetworkPolicy/gateway-ingress opens {sorted(opened)}, "
            f"the gateway listens on {sorted(ports.values())}"
        )
    workers = int(env.get("GATEWAY_WORKERS", {}).get("value", "0"))
    limit = quantity("cpu", c.get("resources", {}).get("limits", {}).get("cpu", "0"))
    if not 1 <= workers <= max(limit, 1):
        errors.append(f"gateway GATEWAY_WORKERS={workers} does not fit its cpu limit {limit:g}")
    return errors


def check_redis(docs: list[dict[str, Any]]) -> list[str]:
    """Redis holds API keys and canary weights: AOF persistence on a PersistentVolume, one instance."""
    errors = []
    redis = [w for w in workloads(docs) if w["metadata"]["name"] == "redis"]
    if len(redis) != 1 or redis[0]["kind"] != "StatefulSet":
        return ["redis is not one StatefulSet (its data needs a stable PersistentVolume)"]
    spec = redis[0]["spec"]
    if spec.get("replicas") != 1:
        errors.append("redis must run exactly one replica (two would split the state)")
    (c,) = [c for _, c in containers(redis[0], init=False)]
    args = c.get("args", [])
    if "--appendonly" not in args or args[args.index("--appendonly") + 1] != "yes":
        errors.append(
            "redis runs without AOF persistence (--appendonly yes): a restart would lose every API key"
        )
    data_dir = args[args.index("--dir") + 1] if "--dir" in args else "/data"
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    if mounts.get(data_dir) not in claims:
        errors.append(f"redis data dir {data_dir} is not on a PersistentVolumeClaim")
    return errors


def check_images_from_kustomization(docs: list[dict[str, Any]]) -> list[str]:
    """No placeholder registry; the platform's images carry the project version (the `images:` list
    of k8s/base/kustomization.yaml sets every tag)."""
    errors = []
    version = project_version()
    for w in workloads(docs):
        for _, c in containers(w):
            image = c.get("image", "")
            if any(p in image for p in PLACEHOLDER_REGISTRIES):
                errors.append(
                    f"{name_of(w)}: container {c['name']} image {image!r} names a placeholder registry"
                )
            name = image.split("@")[0].rsplit("/", 1)[-1]
            if (
                name.startswith(IMAGE_PREFIX)
                and "@sha256:" not in image
                and not image.endswith(f":{version}")
            ):
                errors.append(
                    f"{name_of(w)}: container {c['name']} image {image!r} is not tagged {version}"
                )
    return errors


def check_gpu(docs: list[dict[str, Any]]) -> list[str]:
    """GPU overlays: Triton gets one GPU, lands on RTX 4090 nodes, tolerates their taint."""
    errors = []
    triton = find(docs, "Deployment", "triton")
    spec = pod_spec(triton)
    (c,) = [c for _, c in containers(triton, init=False) if c["name"] == "triton"]
    res = c["resources"]
    if (
        res.get("limits", {}).get("nvidia.com/gpu") != "1"
        or res.get("requests", {}).get("nvidia.com/gpu") != "1"
    ):
        errors.append("triton does not request and limit nvidia.com/gpu: 1")
    if spec.get("nodeSelector", {}).get("nvidia.com/gpu.product") != "NVIDIA-GeForce-RTX-4090":
        errors.append("triton is not pinned to RTX 4090 nodes")
    if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
        errors.append("triton does not tolerate the nvidia.com/gpu taint")
    if (
        find(docs, "ConfigMap", "model-repository")["data"]["MODEL_REPOSITORY_PREFIX"]
        != "model_repository/rtx4090"
    ):
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
    r"sum\(rate\(nv_inference_queue_duration_us(\{[^}]*\})?\[1m\]\)\)\s*/\s*"
    r"\(?\s*sum\(rate\(nv_inference_request_success(\{[^}]*\})?\[1m\]\)\)"
)
_P99 = re.compile(
    r"histogram_quantile\(0\.99,\s*sum by \(le, model\) "
    r"\(rate\(gateway_request_duration_seconds_bucket\[5m\]\)\)\)"
)


def check_observability(docs: list[dict[str, Any]]) -> list[str]:
    """KEDA scales Triton on request-weighted queue time (server#8979) as a Value metric; an alert
    fires on the gateway's aggregatable P99 over the SLO; both Deployments are scraped."""
    errors = []
    scaled = [
        d
        for d in docs
        if d["kind"] == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == "triton"
    ]
    if len(scaled) != 1:
        errors.append("no ScaledObject for triton")
    else:
        for trigger in scaled[0]["spec"]["triggers"]:
            query = " ".join(trigger["metadata"].get("query", "").split())
            if not _QUEUE_QUERY.search(query):
                errors.append(f"KEDA query is not request-weighted queue time: {query!r}")
            if trigger.get("metricType") != "Value":
                errors.append(
                    "KEDA trigger must use metricType Value (the query is already a ratio)"
                )
    rules = [
        r
        for d in docs
        if d["kind"] == "PrometheusRule"
        for g in d["spec"]["groups"]
        for r in g["rules"]
    ]
    records = {r["record"]: " ".join(r["expr"].split()) for r in rules if "record" in r}

    def expand(expr: str) -> str:
        for name, body in records.items():
            expr = expr.replace(name, body)
        return " ".join(expr.split())

    p99_alerts = [
        r
        for r in rules
        if "alert" in r
        and _P99.search(expand(r["expr"]))
        and re.search(r">\s*[0-9.]+$", expand(r["expr"]))
    ]
    if not p99_alerts:
        errors.append(
            "no alert on histogram_quantile(0.99, ...gateway_request_duration_seconds_bucket...) > SLO"
        )
    monitored = {
        d["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name")
        for d in docs
        if d["kind"] == "ServiceMonitor"
    }
    for app in ("gateway", "triton"):
        if app not in monitored:
            errors.append(f"no ServiceMonitor scrapes {app}")
    return errors
