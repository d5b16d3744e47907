"""The rendered manifests validate against the Kubernetes schema and hold the platform's invariants.

Every kustomization (the CPU base and the GPU overlays) is rendered by the real kustomize
(``kubectl kustomize``, as ``kubectl apply -k`` renders it) and each
check in k8s_checks runs over all of its documents. The second half breaks a copy of the manifests
in one way per check and asserts the check notices, so no check passes vacuously.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.support.k8s_checks import CHECKS
from tests.support.k8s_render import (
    GPU_KUSTOMIZATIONS,
    K8S,
    KUSTOMIZATIONS,
    REPO,
    RenderError,
    containers,
    find,
    pod_spec,
    render,
    rendered,
)
from tests.support.k8s_workload_checks import check_cpu_only, check_gpu

Docs = list[dict[str, Any]]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_invariant_holds(kustomization: str, check: str) -> None:
    assert CHECKS[check](rendered(kustomization)) == []


def test_base_is_cpu_only() -> None:
    assert check_cpu_only(rendered("base")) == []


@pytest.mark.parametrize("kustomization", GPU_KUSTOMIZATIONS)
def test_gpu_overlay_places_triton_on_rtx4090(kustomization: str) -> None:
    assert check_gpu(rendered(kustomization)) == []


def test_kustomizations_render_the_expected_objects() -> None:
    kinds = sorted({d["kind"] for d in rendered("overlays/rtx4090")})
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "Namespace",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "PrometheusRule",
            "ScaledObject",
            "Secret",
            "Service",
            "ServiceMonitor",
            "StatefulSet",
        ]
    )
    assert {d["metadata"]["name"] for d in rendered("base") if d["kind"] == "Deployment"} == {
        "triton",
        "gateway",
    }
    assert {d["metadata"]["name"] for d in rendered("base") if d["kind"] == "StatefulSet"} == {
        "redis"
    }


def test_pvc_overlay_replaces_the_sync_with_a_claim() -> None:
    docs = rendered("overlays/rtx4090-pvc")
    spec = pod_spec(find(docs, "Deployment", "triton"))
    assert "initContainers" not in spec
    assert spec["volumes"][0] == {
        "name": "model-repository",
        "persistentVolumeClaim": {"claimName": "model-repository", "readOnly": True},
    }
    assert find(docs, "PersistentVolumeClaim", "model-repository")["spec"]["accessModes"] == [
        "ReadOnlyMany"
    ]


def test_s3_overlay_syncs_with_an_init_container() -> None:
    spec = pod_spec(find(rendered("overlays/rtx4090"), "Deployment", "triton"))
    (sync,) = spec["initContainers"]
    assert sync["args"][:3] == [
        "s3",
        "sync",
        "s3://$(MODEL_REPOSITORY_BUCKET)/$(MODEL_REPOSITORY_PREFIX)",
    ]
    assert {"name": "model-repository", "mountPath": "/models"} in sync["volumeMounts"]


#: files under k8s/ that are not manifests, each read by the test named beside it
NOT_MANIFESTS = {
    "checkov-accepted.yaml": "test_k8s_checkov.py",
    "monitoring/alert-tests.yaml": "test_k8s_monitoring.py",
}


def test_every_manifest_file_is_rendered_by_some_kustomization() -> None:
    """No orphan YAML or JSON: a file the kustomizations do not reach would be validated by nobody."""
    reached: set[str] = set()
    for kustomization in KUSTOMIZATIONS:
        k = yaml.safe_load((K8S / kustomization / "kustomization.yaml").read_text())
        reached.update(str((K8S / kustomization / r).resolve()) for r in k.get("resources", []))
        reached.update(
            str((K8S / kustomization / p["path"]).resolve()) for p in k.get("patches", [])
        )
        for generator in k.get("configMapGenerator", []):
            reached.update(
                str((K8S / kustomization / f.split("=")[-1]).resolve())
                for f in generator.get("files", [])
            )
    reached.update(str((K8S / name).resolve()) for name in NOT_MANIFESTS)
    files = {
        str(p.resolve())
        for pattern in ("*.yaml", "*.json")
        for p in K8S.rglob(pattern)
        if p.name != "kustomization.yaml" and "schemas" not in p.parts
    }
    assert files - reached == set()
    for name, test in NOT_MANIFESTS.items():
        assert (K8S / name).is_file() and name in (REPO / "tests/k8s" / test).read_text(), name


def test_no_secret_values_are_tracked_by_git() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "k8s"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    env_files = [f for f in tracked if f.endswith(".env")]
    assert env_files == [], "real secret env files are committed"
    assert "k8s/base/secrets/gateway.env.example" in tracked


def test_real_render_demands_the_secret_files() -> None:
    """Without the env files `kubectl apply -k` fails: no placeholder Secret can overwrite a real one."""
    if (K8S / "base/secrets/gateway.env").exists():
        pytest.skip("a local gateway.env exists")
    with pytest.raises(RenderError, match="gateway.env"):
        render(K8S / "base")


# --- each check can fail ---------------------------------------------------------------------


def _workload(docs: Docs, name: str) -> dict[str, Any]:
    (w,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == name
    ]
    return w


def _container(docs: Docs, workload: str, name: str, *, init: bool = False) -> dict[str, Any]:
    kind = "initContainers" if init else "containers"
    return next(
        c for k, c in containers(_workload(docs, workload)) if k == kind and c["name"] == name
    )


def _break_schema(docs: Docs) -> None:
    find(docs, "Deployment", "gateway")["spec"]["replica"] = 2  # typo


def _break_crd_schema(docs: Docs) -> None:
    find(docs, "ScaledObject", "triton")["spec"]["triggers"][0]["metadata"]["threshold"] = 20000


def _drop_readiness(docs: Docs) -> None:
    del _container(docs, "redis", "redis")["readinessProbe"]


def _liveness_is_readiness(docs: Docs) -> None:
    gateway = _container(docs, "gateway", "gateway")
    gateway["livenessProbe"] = dict(gateway["readinessProbe"])


def _gateway_without_startup(docs: Docs) -> None:
    del _container(docs, "gateway", "gateway")["startupProbe"]


def _probe_on_init(docs: Docs) -> None:
    _container(docs, "triton", "model-sync", init=True)["livenessProbe"] = {
        "exec": {"command": ["true"]}
    }


def _drop_limits(docs: Docs) -> None:
    del _container(docs, "triton", "model-sync", init=True)["resources"]["limits"]


def _request_over_limit(docs: Docs) -> None:
    _container(docs, "gateway", "gateway")["resources"]["requests"]["memory"] = "2Gi"


def _latest_tag(docs: Docs) -> None:
    _container(docs, "redis", "redis")["image"] = "redis:latest"


def _no_tag(docs: Docs) -> None:
    _container(docs, "gateway", "gateway")["image"] = "registry.internal/triton-platform-gateway"


def _triton_load_balancer(docs: Docs) -> None:
    find(docs, "Service", "triton")["spec"]["type"] = "LoadBalancer"


def _redis_node_port(docs: Docs) -> None:
    find(docs, "Service", "redis")["spec"]["type"] = "NodePort"


def _ingress_to_triton(docs: Docs) -> None:
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": "triton", "namespace": "inference"},
            "spec": {
                "rules": [
                    {
                        "http": {
                            "paths": [
                                {
                                    "path": "/",
                                    "pathType": "Prefix",
                                    "backend": {
                                        "service": {"name": "triton", "port": {"number": 8000}}
                                    },
                                }
                            ]
                        }
                    }
                ]
            },
        }
    )


def _open_triton_to_all(docs: Docs) -> None:
    find(docs, "NetworkPolicy", "triton-ingress")["spec"]["ingress"][0].pop("from")


def _monitoring_reaches_inference_port(docs: Docs) -> None:
    find(docs, "NetworkPolicy", "triton-ingress")["spec"]["ingress"][1]["ports"].append(
        {"protocol": "TCP", "port": 8000}
    )


def _redis_from_anyone_in_namespace(docs: Docs) -> None:
    find(docs, "NetworkPolicy", "redis-ingress")["spec"]["ingress"][0]["from"] = [
        {"podSelector": {}}
    ]


def _drop_default_deny(docs: Docs) -> None:
    docs.remove(find(docs, "NetworkPolicy", "default-deny-ingress"))


def _writable_root(docs: Docs) -> None:
    _container(docs, "triton", "triton")["securityContext"]["readOnlyRootFilesystem"] = False


def _root_pod(docs: Docs) -> None:
    pod_spec(_workload(docs, "redis"))["securityContext"].pop("runAsNonRoot")


def _pdb_misses(docs: Docs) -> None:
    find(docs, "PodDisruptionBudget", "gateway")["spec"]["selector"]["matchLabels"] = {
        "app.kubernetes.io/name": "gw"
    }


def _hpa_wrong_target(docs: Docs) -> None:
    find(docs, "HorizontalPodAutoscaler", "gateway")["spec"]["scaleTargetRef"]["name"] = "gatewy"


def _two_autoscalers(docs: Docs) -> None:
    find(docs, "HorizontalPodAutoscaler", "gateway")["spec"]["scaleTargetRef"]["name"] = "triton"


def _replicas_fight_autoscaler(docs: Docs) -> None:
    find(docs, "Deployment", "triton")["spec"]["replicas"] = 1


def _service_port_name(docs: Docs) -> None:
    find(docs, "Service", "triton")["spec"]["ports"][2]["targetPort"] = "prometheus"


def _template_label_drift(docs: Docs) -> None:
    find(docs, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"][
        "app.kubernetes.io/name"
    ] = "api"


def _missing_secret(docs: Docs) -> None:
    docs.remove(find(docs, "Secret", "gateway-secrets"))


def _unknown_mount(docs: Docs) -> None:
    _container(docs, "gateway", "gateway")["volumeMounts"].append(
        {"name": "cache", "mountPath": "/cache"}
    )


def _other_namespace(docs: Docs) -> None:
    find(docs, "Service", "redis")["metadata"]["namespace"] = "default"


def _poll_mode(docs: Docs) -> None:
    args = _container(docs, "triton", "triton")["args"]
    args[args.index("--model-control-mode=explicit")] = "--model-control-mode=poll"


def _short_startup(docs: Docs) -> None:
    _container(docs, "triton", "triton")["startupProbe"]["failureThreshold"] = 3


def _literal_secret(docs: Docs) -> None:
    env = _container(docs, "gateway", "gateway")["env"]
    (token,) = [e for e in env if e["name"] == "GATEWAY_JWT_SECRET"]
    token.pop("valueFrom")
    token["value"] = "hunter2"


def _average_queue_time(docs: Docs) -> None:
    trigger = find(docs, "ScaledObject", "triton")["spec"]["triggers"][0]
    trigger["metadata"]["query"] = "avg(rate(nv_inference_queue_duration_us[1m]))"


def _average_value_metric(docs: Docs) -> None:
    find(docs, "ScaledObject", "triton")["spec"]["triggers"][0]["metricType"] = "AverageValue"


def _p99_from_triton(docs: Docs) -> None:
    for group in find(docs, "PrometheusRule", "triton-platform-slo")["spec"]["groups"]:
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(
                "gateway_request_duration_seconds_bucket", "nv_inference_request_duration_us"
            )


def _placeholder_registry(docs: Docs) -> None:
    _container(docs, "gateway", "gateway")["image"] = (
        "ghcr.io/example/triton-platform-gateway:0.1.0"
    )


def _stale_image_tag(docs: Docs) -> None:
    _container(docs, "triton", "triton")["image"] = "registry.internal/triton-platform-triton:0.0.9"


def _redis_without_aof(docs: Docs) -> None:
    args = _container(docs, "redis", "redis")["args"]
    args[args.index("--appendonly") + 1] = "no"


def _redis_on_empty_dir(docs: Docs) -> None:
    redis = _workload(docs, "redis")
    redis["spec"].pop("volumeClaimTemplates")
    pod_spec(redis)["volumes"] = [{"name": "data", "emptyDir": {}}]


def _grpc_port_mismatch(docs: Docs) -> None:
    env = _container(docs, "gateway", "gateway")["env"]
    next(e for e in env if e["name"] == "GATEWAY_GRPC_PORT")["value"] = "9000"


def _grpc_closed_by_policy(docs: Docs) -> None:
    find(docs, "NetworkPolicy", "gateway-ingress")["spec"]["ingress"][0]["ports"].pop()


def _too_many_workers(docs: Docs) -> None:
    env = _container(docs, "gateway", "gateway")["env"]
    next(e for e in env if e["name"] == "GATEWAY_WORKERS")["value"] = "8"


def _gateway_ready_models_literal(docs: Docs) -> None:
    env = _container(docs, "gateway", "gateway")["env"]
    entry = next(e for e in env if e["name"] == "GATEWAY_READY_MODELS")
    entry.pop("valueFrom")
    entry["value"] = "image_classifier"


def _triton_server_readiness_only(docs: Docs) -> None:
    _container(docs, "triton", "triton")["readinessProbe"] = {
        "httpGet": {"path": "/v2/health/ready", "port": "http"}
    }


BREAKAGES: list[tuple[str, Callable[[Docs], None], str]] = [
    ("schema", _break_schema, "Additional properties"),
    ("schema", _break_crd_schema, "is not of type 'string'"),
    ("probes", _drop_readiness, "no readinessProbe"),
    ("probes", _probe_on_init, "init container model-sync has a livenessProbe"),
    ("probes", _liveness_is_readiness, "liveness and readiness probes ask the same"),
    (
        "probes",
        _gateway_without_startup,
        "container gateway has an HTTP livenessProbe but no startupProbe",
    ),
    ("resources", _drop_limits, "no cpu limit"),
    ("resources", _request_over_limit, "memory request 2Gi over limit"),
    ("images_pinned", _latest_tag, "moving tag 'latest'"),
    ("images_pinned", _no_tag, "has no tag"),
    ("exposure", _triton_load_balancer, "Service/triton"),
    ("exposure", _redis_node_port, "Service/redis is exposed"),
    ("exposure", _ingress_to_triton, "routes to 'triton'"),
    ("network_policy", _open_triton_to_all, "opens triton to every source"),
    ("network_policy", _monitoring_reaches_inference_port, "reach triton on ports"),
    ("network_policy", _redis_from_anyone_in_namespace, "reach redis"),
    ("network_policy", _drop_default_deny, "no default-deny"),
    ("security_context", _writable_root, "readOnlyRootFilesystem is not true"),
    ("security_context", _root_pod, "runAsNonRoot is not true"),
    ("selectors", _pdb_misses, "PodDisruptionBudget/gateway selects 0 workloads"),
    ("selectors", _hpa_wrong_target, "does not exist"),
    ("selectors", _two_autoscalers, "several autoscalers"),
    (
        "selectors",
        _replicas_fight_autoscaler,
        "sets replicas although ScaledObject/triton owns the count",
    ),
    ("selectors", _service_port_name, "targetPort 'prometheus'"),
    ("selectors", _template_label_drift, "selector does not match its pod template"),
    ("references", _missing_secret, "needs Secret/gateway-secrets"),
    ("references", _unknown_mount, "unknown volume 'cache'"),
    ("namespace", _other_namespace, "Service/redis is in namespace 'default'"),
    ("triton", _poll_mode, "--model-control-mode=explicit"),
    ("triton", _short_startup, "startupProbe allows under 5 minutes"),
    (
        "triton",
        _triton_server_readiness_only,
        "does not run /opt/triton-platform/model_readiness.py",
    ),
    ("gateway", _grpc_port_mismatch, "is not its grpc container port"),
    ("gateway", _grpc_closed_by_policy, "opens [8080], the gateway listens on [8080, 8081]"),
    ("gateway", _too_many_workers, "GATEWAY_WORKERS=8 does not fit"),
    (
        "gateway",
        _gateway_ready_models_literal,
        "GATEWAY_READY_MODELS does not come from ConfigMap served-models",
    ),
    ("redis", _redis_without_aof, "without AOF persistence"),
    ("redis", _redis_on_empty_dir, "is not on a PersistentVolumeClaim"),
    ("images_from_kustomization", _placeholder_registry, "names a placeholder registry"),
    ("images_from_kustomization", _stale_image_tag, "is not tagged 0.1.0"),
    ("gateway", _literal_secret, "GATEWAY_JWT_SECRET does not come from a Secret"),
    ("observability", _average_queue_time, "not request-weighted"),
    ("observability", _average_value_metric, "metricType Value"),
    ("observability", _p99_from_triton, "no alert on histogram_quantile"),
]


@pytest.mark.parametrize(
    ("check", "breakage", "expected"), BREAKAGES, ids=[b[1].__name__.lstrip("_") for b in BREAKAGES]
)
def test_check_catches_breakage(
    check: str, breakage: Callable[[Docs], None], expected: str
) -> None:
    docs = rendered("overlays/rtx4090")
    breakage(docs)
    errors = CHECKS[check](docs)
    assert any(expected in e for e in errors), errors


def test_every_check_has_a_breakage() -> None:
    assert {b[0] for b in BREAKAGES} == set(CHECKS)


def test_gpu_and_cpu_checks_can_fail() -> None:
    assert any("nvidia.com/gpu: 1" in e for e in check_gpu(rendered("base")))
    assert any("asks for a GPU" in e for e in check_cpu_only(rendered("overlays/rtx4090")))
