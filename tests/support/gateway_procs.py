"""Real processes for tests that drive the gateway: gateway subprocesses, redis-server, 127.0.0.1 only.

Shared by every test folder that starts a gateway (gateway, reliability, promote), so they all start
processes the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.tenancy.secret_policy import generate_secret
from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.ports import reserve_port
from serving.processes import ManagedProcess, child_env
from serving.redis_process import RedisProcess, start_redis

__all__ = [
    "ADMIN_TOKEN",
    "METRICS_HEADERS",
    "METRICS_TOKEN",
    "TEST_TIERS",
    "GatewayProcess",
    "RedisProcess",
    "create_key",
    "start_gateway",
    "start_redis",
    "tiny_request",
]

ROOT = Path(__file__).resolve().parents[2]
#: fresh for each test session: the gateway refuses placeholder secrets, and a test must not lean on a
#: known one (gateway/tenancy/secret_policy.py)
ADMIN_TOKEN = generate_secret()
METRICS_TOKEN = generate_secret()
#: what Prometheus sends to /metrics
METRICS_HEADERS = {"Authorization": f"Bearer {METRICS_TOKEN}"}
#: tiers the tests use: "tiny" makes the shared-limit test independent of how long it takes
#: (one token a minute), "unlimited" keeps the other tests clear of rate limiting.
TEST_TIERS = {
    "free": {"per_minute": 10, "burst": 5},
    "tiny": {"per_minute": 1, "burst": 4},
    "unlimited": {"per_minute": 60_000_000, "burst": 1_000_000},
}
_START_TIMEOUT_S = 30.0


@dataclass
class GatewayProcess:
    """A real gateway subprocess (``python -m gateway``)."""

    url: str
    env: dict[str, str]
    process: ManagedProcess = field(repr=False)

    @property
    def log_path(self) -> Path:
        assert self.process.log_path is not None
        return self.process.log_path

    def log(self) -> str:
        return "\n".join(self.process.log_lines())

    @property
    def grpc_url(self) -> str:
        """``host:port`` of its KServe v2 gRPC entry (started with ``grpc_port=...``)."""
        port = int(self.env.get("GATEWAY_GRPC_PORT", "0"))
        if not port:
            raise RuntimeError(
                "this gateway was started without a gRPC entry (pass grpc_port=reserve_port())"
            )
        return f"127.0.0.1:{port}"

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.process.stop()


def start_gateway(workdir: Path, triton_http_url: str, **settings: object) -> GatewayProcess:
    """Start a gateway subprocess and wait until it answers ``/healthz``.

    Args:
        workdir: where its key database and log go.
        triton_http_url: Triton's host:port.
        settings: GatewaySettings fields (``tier_limits`` etc. as Python values).

    Returns:
        The running gateway.
    """
    port = reserve_port()
    values: dict[str, object] = {
        "host": "127.0.0.1",
        "port": port,
        "triton_http_url": triton_http_url,
        "keys_db": workdir / "keys.sqlite3",
        "admin_token": ADMIN_TOKEN,
        "metrics_token": METRICS_TOKEN,
        "tier_limits": TEST_TIERS,
        "triton_stats_interval_s": 0.5,
        "workers": 1,  # one process unless a test asks for more (automatic would be one per core with Redis)
        # Every test connects from 127.0.0.1, some in tight loops of new connections: a per-address
        # rate in connections per second would make their answers depend on the machine's speed.
        # The accept rate's own tests (test_gateway_accept_rate.py) switch it on with their settings.
        "accept_rate_per_s": 0,
        # Tests drive keys past their limits in tight loops on pooled connections: held connections
        # would make them wait out each Retry-After. test_gateway_read_hold.py switches it on.
        "hold_ignored_retry_after_s": 0,
        "log_level": "info",
    }
    values.update(settings)
    env = child_env(
        {
            f"GATEWAY_{key.upper()}": json.dumps(value)
            if isinstance(value, dict | list)
            else str(value)
            for key, value in values.items()
        }
    )
    process = start_gateway_process(
        GatewayLaunch(
            port,
            env,
            log_path=workdir / f"gateway-{port}.log",
            ready_timeout_s=_START_TIMEOUT_S,
            cwd=ROOT,
        )
    )
    return GatewayProcess(url=f"http://127.0.0.1:{port}", env=env, process=process)


def tiny_request(rows: int = 1) -> dict[str, object]:
    """A KServe v2 JSON body for ``tiny_linear``."""
    return {
        "inputs": [
            {
                "name": "input",
                "shape": [rows, 4],
                "datatype": "FP32",
                "data": [1.0, 2.0, 3.0, 4.0] * rows,
            }
        ]
    }


def create_key(
    gateway: GatewayProcess,
    tier: str = "unlimited",
    scopes: list[str] | None = None,
    name: str = "test",
) -> tuple[dict[str, str], dict[str, object]]:
    """Create an API key through the admin API; returns ``(auth headers, created key document)``."""
    response = httpx.post(
        f"{gateway.url}/admin/keys",
        json={"name": name, "scopes": scopes or ["*"], "tier": tier},
        headers={"X-Admin-Token": ADMIN_TOKEN},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    created = response.json()
    return {"Authorization": f"Bearer {created['api_key']}"}, created


def worker_pids(pid: int) -> list[int]:
    """The worker processes of the multi-worker gateway ``pid`` (uvicorn spawns them; the parent's
    other child, multiprocessing's resource tracker, is left out, and so is a dead worker not yet
    reaped, whose command line is empty)."""
    children = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
