"""The gateway Deployment's command and environment mean what they say to the real gateway.

``GatewaySettings`` ignores unknown ``GATEWAY_*`` variables (``extra="ignore"``), so a misspelt name
in the manifest would silently fall back to a default (Triton on 127.0.0.1). These tests parse the
manifest's args with the gateway's own CLI parser and load its env through ``GatewaySettings``.
"""

from __future__ import annotations

import base64
import os
import sys

import pytest
from k8s_checks import REPO, containers, find, rendered

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.server import build_parser  # noqa: E402
from gateway.settings import GatewaySettings  # noqa: E402


def _gateway_container() -> dict:
    docs = rendered("overlays/rtx4090")
    (c,) = [c for _, c in containers(find(docs, "Deployment", "gateway")) if c["name"] == "gateway"]
    return c


def _resolved_env(docs: list[dict], container: dict) -> dict[str, str]:
    """The container's env as the kubelet would set it (literal values and secretKeyRefs)."""
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            secret = find(docs, "Secret", ref["name"])
            env[e["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
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
    settings = GatewaySettings(**{k: v for k, v in vars(args).items() if v is not None and k != "create_key"})
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)
    assert settings.triton_http_url == "triton:8000"
    assert settings.redis_url.get_secret_value() == "redis://redis:6379/0"
    assert str(settings.keys_db) == "/var/lib/gateway/keys.sqlite"
    assert settings.admin_token.get_secret_value() and settings.jwt_secret.get_secret_value()


def test_container_port_is_the_one_the_gateway_binds() -> None:
    c = _gateway_container()
    args = build_parser().parse_args(c["args"])
    assert [p["containerPort"] for p in c["ports"]] == [args.port]
