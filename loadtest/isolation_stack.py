"""The isolation benchmark's stack and instruments: its settings, the request bodies, Triton with the
fixed-service-time model and the gateway as ``inferctl up`` starts it (:func:`platform`), and the
gateway's CPU meter. :mod:`loadtest.isolation` runs the attacks on it; :mod:`loadtest.gateway_profile`
profiles the gateway on the same stack.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from loadtest.loadgen import HttpTarget
from loadtest.qos import MODEL, QosSettings, prepare_repository
from serving.gateway_process import GatewayLaunch, start_gateway_process
from serving.launcher import TritonPorts, TritonServer
from serving.ports import reserve_port
from serving.processes import child_env

__all__ = [
    "DEFAULT_SETTINGS",
    "SCENARIO_KEYS",
    "CpuMeter",
    "IsolationSettings",
    "Stack",
    "body_of_size",
    "infer_body",
    "infer_url",
    "json_target",
    "platform",
]

#: the scenarios' keys (``--scenario``), in the order they run
SCENARIO_KEYS = ("big-bodies", "at-cap", "idle", "disconnect", "paced-flood", "flood")


@dataclass(frozen=True, kw_only=True)
class IsolationSettings:
    """What the benchmark runs (the issue's scale by default).

    Args:
        service_ms, instances: the model's fixed service time and instance count.
        protected_concurrency: the protected key's requests in flight.
        warmup_s, duration_s: per run (each scenario runs alone, then attacked).
        big_body_bytes, big_body_concurrency: the over-the-cap bodies and how many at once.
        idle_connections: connections the idle attack holds.
        disconnect_concurrency, abandon_after_ms: the disconnect storm.
        flood_multiple, flood_concurrency: the paced flood's rate (times the free tier's key rate)
            and the workers of both floods.
        out_dir: where the files go.
        only: the keys (:data:`SCENARIO_KEYS`) of the scenarios to run; empty: all of them.
    """

    service_ms: float = 5.0
    instances: int = 2
    protected_concurrency: int = 2
    warmup_s: float = 3.0
    duration_s: float = 20.0
    big_body_bytes: int = 15 * 1024 * 1024
    big_body_concurrency: int = 4
    idle_connections: int = 1000
    disconnect_concurrency: int = 16
    abandon_after_ms: float = 5.0
    flood_multiple: float = 10.0
    flood_concurrency: int = 8
    out_dir: Path = Path("isolation-results")
    only: tuple[str, ...] = ()


DEFAULT_SETTINGS = IsolationSettings()


def infer_body(values: int = 1) -> bytes:
    """A KServe v2 JSON request for the model: ``values`` INT32s (one is what the model takes)."""
    data = ",".join(["1"] * values)
    return f'{{"inputs":[{{"name":"X","shape":[{values}],"datatype":"INT32","data":[{data}]}}]}}'.encode()


def body_of_size(size: int) -> bytes:
    """A KServe v2 JSON body of about ``size`` bytes (a long INT32 list: costly to parse)."""
    overhead = len(infer_body(1)) - 1
    return infer_body(max(1, (size - overhead + 1) // 2))


class Stack(NamedTuple):
    """The gateway in front of Triton: its URL, its process id, how to make keys, its metrics token."""

    url: str
    pid: int
    new_key: Callable[[str, str], str]
    metrics_token: str


@contextlib.contextmanager
def platform(
    workdir: Path,
    settings: IsolationSettings,
    profile_to: Path | None = None,
    gateway_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """Triton with the benchmark's model and the gateway as ``inferctl up`` starts it (default tiers,
    generated secrets, no development switch); yields the :class:`Stack`. With ``profile_to``, the
    gateway runs under cProfile (:mod:`loadtest._profiled_gateway`), which writes its statistics
    there when the gateway stops (:mod:`loadtest.gateway_profile`); ``gateway_env`` adds
    ``GATEWAY_*`` settings to its environment."""
    from gateway.tenancy.keys_sqlite import SqliteKeyStore
    from inferctl.up_secrets import load_or_create_secrets

    repository = prepare_repository(
        workdir / "repository",
        QosSettings(service_ms=settings.service_ms, instances=settings.instances),
    )
    keys_db = workdir / "keys.sqlite3"
    store = SqliteKeyStore(keys_db)
    secrets = load_or_create_secrets(workdir / "state", environ={})
    with TritonServer(repository, ports=TritonPorts.free()) as triton:
        port = reserve_port()
        # A profiled run wraps the gateway's entry (loadtest.gateway_profile): same arguments.
        entry = (
            ("gateway",) if profile_to is None else ("loadtest._profiled_gateway", str(profile_to))
        )
        env = child_env({**secrets, "GATEWAY_LOG_LEVEL": "warning", **(gateway_env or {})})
        launch = replace(
            GatewayLaunch.local(
                port, triton.http_url, keys_db, env=env, log_path=workdir / "gateway.log"
            ),
            entry=entry,
        )
        with start_gateway_process(launch) as gateway:
            assert gateway.pid is not None

            def new_key(name: str, tier: str) -> str:
                return store.create(name, ["*"], tier)[1]

            yield Stack(launch.url, gateway.pid, new_key, secrets["GATEWAY_METRICS_TOKEN"])


def infer_url(base_url: str) -> str:
    return f"{base_url}/v2/models/{MODEL}/infer"


def json_target(
    base_url: str, key: str, body: bytes, name: str, source_address: str | None = None
) -> HttpTarget:
    return HttpTarget(
        url=infer_url(base_url),
        requests=((body, {"Content-Type": "application/json"}),),
        headers={"Authorization": f"Bearer {key}"},
        name=name,
        timeout_s=120.0,
        source_address=source_address,
    )


class CpuMeter:
    """The gateway process's CPU time (user + system), sampled every ``interval_s`` by a thread, so
    that the CPU spent inside a load run's measured window can be read afterwards (the load runs in
    child processes; ``time.monotonic`` is one clock for all of them)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        import psutil

        self._process = psutil.Process(pid)
        self._interval_s = interval_s
        self._samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="gateway-cpu", daemon=True)

    def _now(self) -> tuple[float, float, float]:
        times = self._process.cpu_times()
        return time.monotonic(), float(times.user), float(times.system)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._samples.append(self._now())

    def __enter__(self) -> CpuMeter:
        self._samples.append(self._now())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._samples.append(self._now())

    def between(self, start: float, end: float) -> float:
        """CPU seconds spent from ``start`` to ``end`` (monotonic), interpolated between samples."""
        user, system = self.split(start, end)
        return user + system

    def split(self, start: float, end: float) -> tuple[float, float]:
        """User and system CPU seconds spent from ``start`` to ``end``, interpolated between samples."""
        times = [t for t, _, _ in self._samples]
        spent = []
        for column in (1, 2):
            cpus = [sample[column] for sample in self._samples]
            spent.append(float(np.interp(end, times, cpus) - np.interp(start, times, cpus)))
        return spent[0], spent[1]
