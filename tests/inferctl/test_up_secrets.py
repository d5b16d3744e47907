"""``inferctl up``'s secrets file: generated strong, created 0600, reused, overridable, never printed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.tenancy.secret_policy import secret_problems
from inferctl.up_secrets import SECRET_NAMES, SECRETS_FILE, load_or_create_secrets


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_up_generates_strong_secrets_in_a_0600_file(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a usual umask would make a plain new file 0644
    try:
        made = load_or_create_secrets(tmp_path / "state", environ={})
    finally:
        os.umask(old)
    path = tmp_path / "state" / SECRETS_FILE
    assert _mode(path) == 0o600 and _mode(tmp_path / "state") == 0o700
    assert set(made) == set(SECRET_NAMES) and len(set(made.values())) == len(SECRET_NAMES)
    settings = GatewaySettings(
        admin_token=made["GATEWAY_ADMIN_TOKEN"],
        jwt_secret=made["GATEWAY_JWT_SECRET"],
        metrics_token=made["GATEWAY_METRICS_TOKEN"],
    )
    assert secret_problems(settings) == []  # the gateway accepts what up generates
    assert not list((tmp_path / "state").glob(".*.tmp")), "no temporary file left behind"


def test_the_next_up_reuses_them_and_restores_a_widened_mode(tmp_path: Path) -> None:
    first = load_or_create_secrets(tmp_path, environ={})
    path = tmp_path / SECRETS_FILE
    path.chmod(0o644)
    assert load_or_create_secrets(tmp_path, environ={}) == first
    assert _mode(path) == 0o600


def test_the_environment_wins_and_a_missing_secret_is_added(tmp_path: Path) -> None:
    path = tmp_path / SECRETS_FILE
    path.write_text("# older file\nGATEWAY_ADMIN_TOKEN=kept-admin-token-from-before-0123\n")
    made = load_or_create_secrets(
        tmp_path,
        environ={
            "GATEWAY_METRICS_TOKEN": "operator-metrics-token-4f2a9c",
            "GATEWAY_JWT_SECRET": "",
        },
    )
    assert made["GATEWAY_ADMIN_TOKEN"] == "kept-admin-token-from-before-0123"
    assert made["GATEWAY_METRICS_TOKEN"] == "operator-metrics-token-4f2a9c"
    stored = path.read_text()
    assert "operator-metrics-token" not in stored, (
        "an operator's own value is not written to the file"
    )
    assert "GATEWAY_JWT_SECRET=" + made["GATEWAY_JWT_SECRET"] in stored and _mode(path) == 0o600


def test_the_admin_token_file_of_earlier_releases_is_kept(tmp_path: Path) -> None:
    (tmp_path / "admin_token").write_text("legacy-admin-token-7c1e55b09a\n")
    assert (
        load_or_create_secrets(tmp_path, environ={})["GATEWAY_ADMIN_TOKEN"]
        == "legacy-admin-token-7c1e55b09a"
    )


@pytest.mark.parametrize("command", [["up", "--help"]])
def test_up_says_where_the_secrets_live(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from inferctl.cli import main

    with pytest.raises(SystemExit):
        main(command)
    assert "secrets.env, mode 0600" in capsys.readouterr().out
