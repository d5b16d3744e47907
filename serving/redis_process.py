"""The one ``redis-server`` launcher, shared by the benchmarks, the tests and the scaling runs.

A real ``redis-server`` (``$REDIS_SERVER``, else the one on ``PATH``) on 127.0.0.1 and a reserved
port, started through the one process helper (:mod:`serving.processes`) and ready once it answers
PING. It can be stopped and started again on its port (the fault tests do).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from serving.ports import reserve_port
from serving.processes import ManagedProcess, ProcessStartError

__all__ = ["RedisProcess", "redis_binary", "redis_server", "start_redis"]


def redis_binary() -> str:
    """``$REDIS_SERVER`` or ``redis-server`` on the PATH.

    Raises:
        ProcessStartError: none found.
    """
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        raise ProcessStartError(
            "redis-server not found: install it (apt-get install redis-server; `./run test` does) "
            "or set REDIS_SERVER"
        )
    return binary


@dataclass
class RedisProcess:
    """A real ``redis-server`` on 127.0.0.1; can be stopped and started on its port.

    Attributes:
        workdir: its working directory (the append-only file, when persistent).
        port: its port (reserved when not given).
        persistent: keep an append-only file in ``workdir`` (as the deployment's Redis does), so a
            restart keeps what was stored; without it a restart comes back empty.
        log_path: where its output goes (``None``: inherited).
    """

    workdir: Path
    port: int = field(default_factory=reserve_port)
    persistent: bool = False
    log_path: Path | None = None
    process: ManagedProcess | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        """Start it and wait until it answers PING.

        Raises:
            ProcessStartError: no binary, or it did not answer within ``timeout_s``.
        """
        command = [
            redis_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persistent else "no",
            "--appendfsync",
            "always",
            "--dir",
            str(self.workdir),
        ]
        self.process = ManagedProcess(command, name="redis-server", log_path=self.log_path).start()
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=0.5)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        try:
            self.process.wait_until(answers, timeout_s, what="answering PING")
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop()


def start_redis(workdir: Path) -> RedisProcess:
    """Start a real redis-server on a reserved port and wait until it answers PING."""
    return RedisProcess(workdir).start()


@contextlib.contextmanager
def redis_server(workdir: Path, timeout_s: float = 30.0) -> Iterator[str]:
    """A redis-server for the length of a ``with``: no persistence, output in ``workdir/redis.log``;
    yields its URL."""
    server = RedisProcess(workdir, log_path=workdir / "redis.log").start(timeout_s)
    try:
        yield server.url
    finally:
        server.stop()
