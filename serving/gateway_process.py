"""The one gateway launcher: ``python -m gateway`` as a child process, for the platform's start
command, the benchmarks and the tests.

The gateway is started through the one process helper (:mod:`serving.processes`) and is ready
when its ``/healthz`` answers. Nothing of :mod:`gateway` is imported here: the child reads its
settings from its command line and ``GATEWAY_*`` environment, as in production.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from serving.processes import ManagedProcess, python_module

__all__ = ["GatewayLaunch", "start_gateway_process"]


@dataclass(frozen=True)
class GatewayLaunch:
    """How one gateway process is started.

    Attributes:
        port: the HTTP port it listens on (given as ``--port`` or ``GATEWAY_PORT`` by the caller;
            used here to know where ``/healthz`` answers).
        env: its whole environment (pass it through :func:`serving.processes.child_env` for the
            parent's), ``None``: the parent's.
        args: arguments after ``python -m gateway``.
        log_path: where its output goes (``None``: the last lines are kept in memory).
        ready_timeout_s: how long ``/healthz`` may take to answer.
        name: what errors call it.
        cwd: its working directory.
        inherit_output: write to this process's terminal instead (``inferctl up``).
        host: the address ``/healthz`` is read on.
        entry: what ``python -m`` runs before ``args``: the gateway, or a wrapper of it taking
            its own arguments first (a profiler's).
    """

    port: int
    env: Mapping[str, str] | None = None
    args: tuple[str, ...] = ()
    log_path: Path | None = None
    ready_timeout_s: float = 120.0
    name: str = "gateway"
    cwd: Path | None = None
    inherit_output: bool = False
    host: str = "127.0.0.1"
    entry: tuple[str, ...] = ("gateway",)

    @classmethod
    def local(
        cls,
        port: int,
        triton_url: str,
        keys_db: Path,
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> GatewayLaunch:
        """A gateway on loopback in front of ``triton_url`` with the keys in ``keys_db``, logging
        warnings only (the benchmarks' gateway: what they measure is not slowed by access logs).

        Args:
            port: its HTTP port.
            triton_url: Triton's HTTP endpoint (``host:port`` or a URL).
            keys_db: the SQLite key store it reads.
            env: its whole environment, as for the constructor.
            log_path: where its output goes.
            args: more arguments after the standard ones (``--workers 4``).
        """
        return cls(
            port,
            env,
            args=(
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--triton-url",
                triton_url,
                "--keys-db",
                str(keys_db),
                "--log-level",
                "warning",
                *args,
            ),
            log_path=log_path,
        )

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def process(self) -> ManagedProcess:
        """The process, not started yet."""
        return ManagedProcess(
            python_module(*self.entry, *self.args),
            name=self.name,
            log_path=self.log_path,
            env=self.env,
            cwd=self.cwd,
            inherit_output=self.inherit_output,
        )


def start_gateway_process(launch: GatewayLaunch) -> ManagedProcess:
    """Start a gateway and wait until its ``/healthz`` answers; stopped again if it does not.

    Args:
        launch: how to start it.

    Returns:
        The running process (a context manager that stops it).

    Raises:
        ProcessStartError: it exited, or did not answer within ``launch.ready_timeout_s``.
    """
    process = launch.process().start()
    try:
        process.wait_http(f"{launch.url}/healthz", launch.ready_timeout_s)
    except BaseException:
        process.stop()
        raise
    return process
