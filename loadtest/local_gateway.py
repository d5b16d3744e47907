"""A real gateway process on loopback for a benchmark: in front of its Triton, with a SQLite key store
of its own holding one key per tier, warnings-only logs and no Triton statistics polling (what a
benchmark measures is the path, not the gateway's housekeeping)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.ports import reserve_port
from serving.processes import child_env

__all__ = ["LocalGateway", "local_gateway"]


@dataclass(frozen=True)
class LocalGateway:
    """A started gateway: its base URL, an API key per tier, and its admin token (reads ``/metrics``)."""

    url: str
    keys: dict[str, str]
    admin_token: str


@contextlib.contextmanager
def local_gateway(
    triton_http_url: str,
    workdir: Path,
    *,
    tiers: Mapping[str, Mapping[str, Any]],
    key_names: Mapping[str, str],
    env: Mapping[str, str] | None = None,
) -> Iterator[LocalGateway]:
    """Start the gateway; stopped when the block ends.

    Args:
        triton_http_url: the Triton it fronts.
        workdir: for its key store and log (created).
        tiers: ``GATEWAY_TIER_LIMITS``: tier -> its policy.
        key_names: tier -> the name of the one key made in it (every model allowed).
        env: more ``GATEWAY_*`` settings; they win over the ones set here.
    """
    from gateway.tenancy.keys_sqlite import SqliteKeyStore
    from gateway.tenancy.secret_policy import generate_secret

    workdir.mkdir(parents=True, exist_ok=True)
    keys_db = workdir / "keys.sqlite3"
    store = SqliteKeyStore(keys_db)
    keys = {tier: store.create(name, ["*"], tier)[1] for tier, name in key_names.items()}
    port = reserve_port()
    admin_token = generate_secret()
    full_env = child_env(
        {
            "GATEWAY_TIER_LIMITS": json.dumps(tiers),
            "GATEWAY_TRITON_STATS_INTERVAL_S": "0",
            "GATEWAY_LOG_LEVEL": "warning",
            # the gateway refuses to serve without a real one
            "GATEWAY_ADMIN_TOKEN": admin_token,
            **(env or {}),
        }
    )
    launch = GatewayLaunch.local(
        port, triton_http_url, keys_db, env=full_env, log_path=workdir / "gateway.log"
    )
    with start_gateway_process(launch):
        yield LocalGateway(launch.url, keys, admin_token)
