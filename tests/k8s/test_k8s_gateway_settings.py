"""The gateway Deployment's command and environment mean what they say to the real gateway.

``GatewaySettings`` ignores unknown ``GATEWAY_*`` variables (``extra="ignore"``), so a misspelt name
in the manifest would silently fall back to a default (Triton on 127.0.0.1). These tests parse the
manifest's args with the gateway's own CLI parser and load its env through ``GatewaySettings``.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from gateway.http.server import build_parser
from gateway.settings import GatewaySettings
from gateway.tenancy.secret_policy import secret_problems
from tests.support.k8s_render import containers, find, rendered

REPO = Path(__file__).resolve().parents[2]


def _gateway_container() -> dict:
    docs = rendered("overlays/rtx4090")
    (c,) = [c for _, c in containers(find(docs, "Deployment", "gateway")) if c["name"] == "gateway"]
    return c


def _resolved_env(docs: list[dict], container: dict) -> dict[str, str]:
    """The container's env as the kubelet would set it (literal values, secretKeyRefs, configMapKeyRefs)."""
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            secret = find(docs, "Secret", ref["name"])
            env[e["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        else:
            ref = e["valueFrom"]["configMapKeyRef"]
            env[e["name"]] = find(docs, "ConfigMap", ref["name"])["data"][ref["key"]]
    return env


def test_every_gateway_env_name_is_a_setting() -> None:
    fields = {f"GATEWAY_{name.upper()}" for name in GatewaySettings.model_fields}
    names = {e["name"] for e in _gateway_container()["env"] if e["name"].startswith("GATEWAY_")}
    assert names - fields == set(), f"not read by GatewaySettings: {sorted(names - fields)}"


def test_gateway_settings_load_from_the_manifest_env(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = rendered("overlays/rtx4090")
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)
    for name, value in _resolved_env(docs, _gateway_container()).items():
        monkeypatch.setenv(name, value)
    c = _gateway_container()
    assert c["command"] == ["python", "-m", "gateway"]
    args = build_parser().parse_args(c["args"])
    settings = GatewaySettings(
        **{k: v for k, v in vars(args).items() if v is not None and k != "create_key"}
    )
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)
    assert settings.triton_http_url == "triton:8000"
    assert settings.redis_url.get_secret_value() == "redis://redis:6379/0"
    assert str(settings.keys_db) == "/var/lib/gateway/keys.sqlite"
    assert settings.grpc_port == 8081 and settings.triton_grpc_url == "triton:8001"
    assert settings.ready_models == ("image_classifier", "text_embedding")
    # Several workers need Redis; the manifest's count is what the gateway will run.
    assert settings.worker_count() == 2
    assert settings.admin_token.get_secret_value() and settings.jwt_secret.get_secret_value()
    assert (
        secret_problems(settings) == [] and not settings.dev_insecure
    )  # filled in, the gateway serves


def test_the_secrets_template_holds_no_value_the_gateway_would_serve_with() -> None:
    template = (REPO / "k8s/base/secrets/gateway.env.example").read_text()
    values = dict(
        line.split("=", 1) for line in template.splitlines() if line and not line.startswith("#")
    )
    assert set(values) == {"GATEWAY_ADMIN_TOKEN", "GATEWAY_JWT_SECRET", "GATEWAY_METRICS_TOKEN"}
    settings = GatewaySettings(
        **{name.removeprefix("GATEWAY_").lower(): value for name, value in values.items()}
    )
    assert any("GATEWAY_ADMIN_TOKEN" in p for p in secret_problems(settings)), (
        "copied unfilled, it is refused"
    )


def test_container_ports_are_the_ones_the_gateway_binds() -> None:
    c = _gateway_container()
    args = build_parser().parse_args(c["args"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": args.port,
        "grpc": int(env["GATEWAY_GRPC_PORT"]),
    }
