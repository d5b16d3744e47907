"""The processes the scaling benchmark (:mod:`loadtest.scaling`) starts, and the pieces
:mod:`loadtest.propagation` reuses: Triton on a repository holding the tiny model (an instant Python
model, so what is measured is the path), a redis-server, one gateway process per path, and a key of
the ``bench`` tier in the Redis store they share; with :func:`machine_load`, how busy the machine was.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.redis_process import redis_server

__all__ = [
    "BENCH_TIER",
    "TINY_MODEL",
    "PathConfig",
    "bench_key",
    "gateway_process",
    "machine_load",
    "services",
    "write_tiny_model",
]

TINY_MODEL = "scaling_tiny"
#: the one tier of every gateway here (and of loadtest.clients_bench's): limits no benchmark reaches,
#: and the first priority level, the one direct clients ask for, so both paths meet the same queue
BENCH_TIER = {"bench": {"per_minute": 1e12, "burst": 1_000_000_000, "priority": 1}}


@dataclass(frozen=True)
class PathConfig:
    """One way to reach the model: direct (``workers == 0``) or a gateway with ``workers`` processes."""

    workers: int
    transport: str = "http"

    @property
    def label(self) -> str:
        return "direct triton" if not self.workers else f"gateway {self.workers}w {self.transport}"


def machine_load(sample_s: float = 2.0) -> dict[str, object]:
    """The CPU, and how busy the machine is now: CPU use over ``sample_s`` and the load averages."""
    import psutil

    from loadtest.bench.report import cpu_model

    cpu = cpu_model()
    return {
        "cpu": platform.machine() if cpu is None else cpu,
        "usable_cores": len(os.sched_getaffinity(0)),
        "busy_percent": psutil.cpu_percent(interval=sample_s),
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


def write_tiny_model(root: Path, name: str = TINY_MODEL, versions: Sequence[int] = (1,)) -> Path:
    """Write a model entry to ``root/name``: a Python model with a [4] -> [2] FP32 interface that
    answers at once (the load generator's instant model), every version in ``versions`` served."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    from builders.triton_config import write_config

    spec = importlib.util.find_spec("loadtest.loadgen.instant_model")
    assert spec is not None and spec.origin is not None
    for version in versions:
        (root / name / str(version)).mkdir(parents=True)
        shutil.copyfile(spec.origin, root / name / str(version) / "model.py")
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 64,
        "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [2]}],
        "dynamic_batching": {},
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "version_policy": {"specific": {"versions": list(versions)}},
    }
    return write_config(
        json_format.ParseDict(config, mc.ModelConfig()), root / name / "config.pbtxt"
    )


def _serving_repository(repository: Path, workdir: Path) -> Path:
    """The repository Triton serves here: every entry of ``repository`` linked, and the tiny model
    written beside them. It has to be on disk: the gateway serves only the names in Triton's
    repository index, which does not list a model loaded with its files in the request.
    ``repository`` itself is not written to."""
    root = workdir / "repository"
    root.mkdir()
    for entry in repository.resolve().iterdir():
        (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    write_tiny_model(root)
    return root


@contextlib.contextmanager
def gateway_process(name: str, settings: dict[str, str], workdir: Path) -> Iterator[str]:
    """``python -m gateway`` with ``GATEWAY_*`` ``settings`` on a free loopback port; yields ``host:port``."""
    from gateway.tenancy.secret_policy import generate_secret
    from serving.ports import reserve_port
    from serving.processes import child_env

    port = reserve_port()
    # The gateway refuses to serve without a real admin token: a fresh one per run (settings may name theirs).
    env = {
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port),
        "GATEWAY_LOG_LEVEL": "warning",
        "GATEWAY_KEYS_DB": str(workdir / "unused.sqlite3"),
        "GATEWAY_ADMIN_TOKEN": generate_secret(),
        **settings,
    }
    log = workdir / f"{name.replace(' ', '-')}.log"
    with start_gateway_process(GatewayLaunch(port, child_env(env), log_path=log, name=name)):
        yield f"127.0.0.1:{port}"


def bench_key(redis_url: str, tiers: dict[str, dict[str, float]]) -> str:
    """A key of tier ``bench`` in the Redis store every gateway here shares."""
    from gateway.settings import GatewaySettings
    from gateway.tenancy.key_stores import open_key_store

    store = open_key_store(GatewaySettings(redis_url=redis_url, tier_limits=tiers))
    try:
        return store.create("bench", ["*"], "bench")[1]
    finally:
        store.close()


@contextlib.contextmanager
def services(
    repository: Path, model: str, paths: Sequence[PathConfig], workdir: Path
) -> Iterator[tuple[str, dict[PathConfig, str], str]]:
    """Triton, Redis and one gateway per gateway path; yields (Triton HTTP url, path -> url, key)."""
    from serving.launcher import TritonPorts, TritonServer

    with contextlib.ExitStack() as stack:
        served = _serving_repository(repository, workdir)
        triton = stack.enter_context(
            TritonServer(served, models=[model, TINY_MODEL], ports=TritonPorts.free())
        )
        redis_url = stack.enter_context(redis_server(workdir))
        key = bench_key(redis_url, BENCH_TIER)
        urls = {}
        for path in paths:
            urls[path] = stack.enter_context(
                gateway_process(
                    path.label,
                    {
                        "GATEWAY_WORKERS": str(path.workers),
                        "GATEWAY_TRITON_PROTOCOL": path.transport,
                        "GATEWAY_TRITON_HTTP_URL": triton.http_url,
                        "GATEWAY_TRITON_GRPC_URL": triton.grpc_url,
                        "GATEWAY_REDIS_URL": redis_url,
                        "GATEWAY_TIER_LIMITS": json.dumps(BENCH_TIER),
                        "GATEWAY_MAX_IN_FLIGHT_PER_MODEL": "100000",
                    },
                    workdir,
                )
            )
        yield triton.http_url, urls, key
