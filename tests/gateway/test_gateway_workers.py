"""How many workers, and the settings every worker gets (unit tests of single functions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.backends.triton_settings import TritonProtocol
from gateway.http.server import settings_environment
from gateway.settings import GatewaySettings, usable_cores


def test_automatic_workers_follow_the_cores_only_with_redis() -> None:
    assert GatewaySettings().worker_count(cores=16) == 1  # no Redis: one process
    shared = GatewaySettings(redis_url="redis://127.0.0.1:6379/0")
    assert shared.worker_count(cores=16) == 16
    assert GatewaySettings(redis_url="redis://r:6379/0", workers=3).worker_count(cores=16) == 3
    assert GatewaySettings(workers=1).worker_count(cores=16) == 1


def test_several_workers_without_redis_are_refused() -> None:
    with pytest.raises(ValueError, match="GATEWAY_REDIS_URL"):
        GatewaySettings(workers=2).worker_count()


def test_a_residency_budget_keeps_one_worker() -> None:
    # The LRU of loaded models lives in the process: one process decides what is evicted.
    budget = {"redis_url": "redis://r:6379/0", "residency_budget_bytes": 1 << 30}
    assert GatewaySettings(**budget).worker_count(cores=16) == 1
    with pytest.raises(ValueError, match="RESIDENCY_BUDGET"):
        GatewaySettings(**budget, workers=2).worker_count()


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000", None),
        ("200000 100000", 2),
        ("150000 100000", 2),
        ("50000 100000", 1),
        ("garbage", None),
    ],
)
def test_a_container_cpu_quota_caps_the_cores(
    tmp_path: Path, cpu_max: str, expected: int | None
) -> None:
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max + "\n")
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(path) == (min(affinity, expected) if expected else affinity)
    assert usable_cores(tmp_path / "missing") == affinity


def test_workers_rebuild_exactly_the_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = GatewaySettings(
        port=9123,
        admin_token="s3cret-admin",
        redis_url="redis://:pw@127.0.0.1:6379/0",
        tier_limits={"gold": {"per_minute": 5, "burst": 2}},
        jwt_algorithms=("HS256",),
        triton_protocol=TritonProtocol.GRPC,
        keys_db=Path("/srv/keys.sqlite3"),
        model_aliases={"mini": "text_embedding"},
        workers=4,
    )
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)
    for name, value in settings_environment(settings).items():
        monkeypatch.setenv(name, value)
    rebuilt = GatewaySettings()
    assert rebuilt.model_dump() == settings.model_dump()
    assert rebuilt.admin_token.get_secret_value() == "s3cret-admin"  # secrets travel, unmasked
    assert rebuilt.redis_url.get_secret_value() == "redis://:pw@127.0.0.1:6379/0"
