"""The gateway refuses placeholder, weak or missing secrets unless GATEWAY_DEV_INSECURE says otherwise."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.settings import GatewaySettings
from gateway.tenancy.secret_policy import (
    MIN_JWT_SECRET_CHARS,
    InsecureSecrets,
    check_secrets,
    generate_secret,
    is_placeholder,
    secret_problems,
)
from serving.ports import reserve_port
from tests.support.gateway_procs import start_gateway

ROOT = Path(__file__).resolve().parents[2]
GOOD = generate_secret()


@pytest.mark.parametrize(
    "value",
    [
        "change-me",
        "CHANGE_ME",
        "<change me>",
        "change-me-in-production",
        "changeme123",
        "replace-me",
        "secret",
        "password",
        "admin",
        "xxxxxxxxxxxxxxxxxxxxxxxx",
        "   ",
    ],
)
def test_template_fillers_are_placeholders(value: str) -> None:
    assert is_placeholder(value)


def test_generated_secrets_are_not_placeholders_and_differ() -> None:
    made = {generate_secret() for _ in range(20)}
    assert len(made) == 20
    assert not any(is_placeholder(s) for s in made)
    assert not secret_problems(
        GatewaySettings(admin_token=GOOD, jwt_secret=GOOD, metrics_token=GOOD, callback_secret=GOOD)
    )


def test_each_bad_secret_is_named_and_its_value_never_shown() -> None:
    settings = GatewaySettings(
        admin_token="change-me",
        jwt_secret="short-jwt-secret-9f3a",
        metrics_token="change-me",
        callback_secret="",
    )
    problems = secret_problems(settings)
    assert len(problems) == 3, problems
    text = " ".join(problems)
    assert (
        "GATEWAY_ADMIN_TOKEN is a placeholder" in text
        and "GATEWAY_METRICS_TOKEN is a placeholder" in text
    )
    assert f"GATEWAY_JWT_SECRET has 21 characters; at least {MIN_JWT_SECRET_CHARS}" in text
    assert "short-jwt-secret-9f3a" not in text and "change-me" not in text.replace("`", "")


def test_the_admin_token_is_required_the_others_are_optional() -> None:
    assert secret_problems(GatewaySettings(admin_token="")) == [
        "GATEWAY_ADMIN_TOKEN is empty (it is required)"
    ]
    assert (
        secret_problems(GatewaySettings(admin_token=GOOD)) == []
    )  # no JWT secret: HS256 tokens are off


def test_a_short_admin_token_is_refused() -> None:
    assert secret_problems(GatewaySettings(admin_token="k3Y-9fQ2")) == [
        "GATEWAY_ADMIN_TOKEN has 8 characters; at least 16 are required"
    ]


def test_check_refuses_unless_the_development_flag_is_set(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(InsecureSecrets, match="GATEWAY_DEV_INSECURE=1"):
        check_secrets(GatewaySettings(admin_token="change-me"))
    with caplog.at_level(logging.WARNING, logger="gateway.tenancy.secret_policy"):
        check_secrets(GatewaySettings(admin_token="change-me", dev_insecure=True))
    assert "serving with insecure secrets" in caplog.text
    check_secrets(GatewaySettings(admin_token=GOOD))  # nothing to say


def test_the_development_flag_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_DEV_INSECURE", "1")
    assert GatewaySettings().dev_insecure


def _gateway_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": str(reserve_port()), **values}


@pytest.mark.integration
@pytest.mark.parametrize("admin_token", ["change-me", ""])
def test_a_real_gateway_process_refuses_to_start(tmp_path: Path, admin_token: str) -> None:
    env = _gateway_env(
        GATEWAY_ADMIN_TOKEN=admin_token,
        GATEWAY_KEYS_DB=str(tmp_path / "k.sqlite3"),
        GATEWAY_JWT_SECRET="change-me",
    )
    done = subprocess.run(
        [sys.executable, "-m", "gateway"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to start with insecure secrets" in done.stderr
    assert (
        "GATEWAY_ADMIN_TOKEN" in done.stderr
        and "GATEWAY_JWT_SECRET is a placeholder" in done.stderr
    )
    with pytest.raises(httpx.TransportError):  # it never listened
        httpx.get(f"http://127.0.0.1:{env['GATEWAY_PORT']}/healthz", timeout=2)


@pytest.mark.integration
def test_a_real_gateway_process_serves_with_placeholders_only_under_the_development_flag(
    tmp_path: Path,
) -> None:
    gateway = start_gateway(
        tmp_path, f"127.0.0.1:{reserve_port()}", admin_token="change-me", dev_insecure=True
    )
    try:
        assert httpx.get(gateway.url + "/healthz", timeout=10).status_code == 200
        assert "GATEWAY_DEV_INSECURE=1: serving with insecure secrets" in gateway.log()
    finally:
        gateway.stop()
