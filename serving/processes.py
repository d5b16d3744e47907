"""Start, watch and stop the servers the platform runs as child processes.

One helper for every server started from Python (Triton, gateways, redis-server, benchmark
baselines, in tests, benchmarks and ``inferctl up``): the child runs in a process group of its own,
so stopping it also stops what it started (Triton's Python-backend stubs, uvicorn workers); its
output goes to a log file or a bounded in-memory buffer, and every failure to start says why, with
the end of that log.

    process = ManagedProcess(["redis-server", "--port", str(port)], name="redis-server").start()
    process.wait_until(lambda: ping(port), timeout_s=10)
    ...
    process.stop()

Ports for these servers come from :mod:`serving.ports`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ManagedProcess", "ProcessStartError", "child_env", "http_ready", "python_module"]

_SOURCE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STOP_TIMEOUT_S = 15.0
_POLL_S = 0.1


class ProcessStartError(RuntimeError):
    """A child did not become ready: it exited, or the condition did not hold in time."""


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child running our packages, plus ``extra``.

    The folder holding ``serving/`` goes first on ``PYTHONPATH``, so ``python -m gateway`` runs this
    source tree's code even where the package is not installed (a plain checkout).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_SOURCE_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def http_ready(url: str, expect: bytes = b"", timeout_s: float = 2.0) -> Callable[[], bool]:
    """A readiness check: ``url`` answers 200 and its body contains ``expect``."""

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return bool(response.status == 200 and expect in response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    return check


@dataclass
class ManagedProcess:
    """A child process in its own process group, with its output captured.

    Args:
        command: the program and its arguments.
        name: what the errors call it ("Triton", "gateway", ...).
        log_path: where its stdout and stderr go; ``None`` keeps the last ``buffer_lines`` lines in
            memory instead (see :meth:`log_tail`).
        env: its environment (default: this process's).
        cwd: its working directory.
        inherit_output: let it write to this process's stdout/stderr (``inferctl up``), no capture.
    """

    command: Sequence[str]
    name: str = "process"
    log_path: Path | None = None
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    inherit_output: bool = False
    buffer_lines: int = 400
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _reaped: bool = field(default=False, init=False, repr=False)
    _buffer: deque[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._buffer = deque(maxlen=self.buffer_lines)

    # -- lifecycle

    def start(self) -> ManagedProcess:
        """Start the child (not waiting for anything); returns ``self``."""
        if self.running():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._buffer.clear()
        self._reaped = False
        stdout: int | None
        if self.inherit_output:
            stdout = None
        elif self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            stdout = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        else:
            stdout = subprocess.PIPE
        try:
            self._process = subprocess.Popen(
                list(self.command),
                stdout=stdout,
                stderr=None if self.inherit_output else subprocess.STDOUT,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise ProcessStartError(
                f"{self.name} could not be started ({self.command[0]}): {exc}"
            ) from exc
        finally:
            if (
                stdout is not None and stdout >= 0
            ):  # our log file's descriptor: the child has its own copy
                os.close(stdout)
        if stdout == subprocess.PIPE:
            threading.Thread(
                target=self._pump, args=(self._process,), name=f"{self.name}-log", daemon=True
            ).start()
        return self

    def _pump(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for raw in process.stdout:
                self._buffer.append(raw.decode(errors="replace").rstrip())

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str = "ready") -> None:
        """Poll ``ready`` until it holds; stop the child and raise if it exits or time runs out.

        Raises:
            ProcessStartError: with the end of the child's log.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running():
                code = self.returncode
                self._join_log()
                self.stop()
                raise ProcessStartError(
                    self.failure(f"{self.name} exited with code {code} before it was {what}")
                )
            if ready():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ProcessStartError(
                    self.failure(f"{self.name} was not {what} after {timeout_s:.0f} s")
                )
            time.sleep(_POLL_S)

    def wait_http(self, url: str, timeout_s: float, expect: bytes = b"") -> None:
        """:meth:`wait_until` ``url`` answers 200 (with ``expect`` in its body)."""
        self.wait_until(http_ready(url, expect), timeout_s, what=f"answering {url}")

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.poll() if self._process is not None else None

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM to the child's process group, SIGKILL after ``timeout_s``; reaps it. Idempotent."""
        process = self._process
        if process is None or self._reaped:
            return
        if process.poll() is None:
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(process, signal.SIGKILL)
                process.wait()
        # Whatever the child started and left behind (a stub, a worker) goes too, once: after that
        # the group id is no longer ours to signal.
        self._signal_group(process, signal.SIGKILL)
        self._reaped = True

    def kill(self) -> None:
        """SIGKILL the whole group at once, as a crash would (fault tests)."""
        process = self._process
        if process is not None and not self._reaped and process.poll() is None:
            self._signal_group(process, signal.SIGKILL)
            process.wait()

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    # -- output

    def _join_log(self) -> None:
        # Give the log pump a moment to read the last lines a dying child wrote.
        deadline = time.monotonic() + 1.0
        while (
            self._process is not None
            and self._process.stdout is not None
            and not self._process.stdout.closed
        ):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)

    def log_lines(self) -> list[str]:
        """Everything captured so far (the file's lines, or the buffer's)."""
        if self.log_path is not None and not self.inherit_output:
            try:
                return self.log_path.read_text(errors="replace").splitlines()
            except FileNotFoundError:
                return []
        return list(self._buffer)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_lines()[-lines:])

    def failure(self, headline: str, lines: int = 40) -> str:
        """``headline`` and the end of the log, for an error message."""
        tail = self.log_tail(lines)
        where = f" ({self.log_path})" if self.log_path is not None else ""
        return (
            f"{headline}\n--- last lines of {self.name}'s output{where} ---\n{tail}"
            if tail
            else headline
        )

    def __enter__(self) -> ManagedProcess:
        return self.start() if not self.running() else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
