"""Run the real Triton Inference Server binary that ships in the ``nvidia-pytriton`` wheel.

Used when no NGC container is at hand (a laptop, CI, a box without Docker). The server runs in
explicit model-control mode, binds to 127.0.0.1 unless told otherwise, and is only handed back
once it and every requested model are READY. Failures come back as :class:`TritonStartError`
with the part of Triton's log that explains them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TritonPorts", "TritonServer", "TritonStartError", "assemble_backends", "free_port"]

_BACKENDS_SOURCE = Path(__file__).parent / "backends"
DEFAULT_STARTUP_TIMEOUT_S = 180.0


class TritonStartError(RuntimeError):
    """Triton did not come up: a port was taken, the binary is missing, or a model failed to load."""


@dataclass(frozen=True)
class TritonPorts:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls) -> TritonPorts:
        return cls(http=free_port(), grpc=free_port(), metrics=free_port())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for tests and side-by-side runs)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_taken(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _pytriton_root() -> Path:
    try:
        import pytriton
    except ImportError as exc:  # pragma: no cover - a broken install
        raise TritonStartError("nvidia-pytriton is not installed; run ./run up to install it") from exc
    return Path(pytriton.__file__).parent / "tritonserver"


def assemble_backends(target: Path) -> Path:
    """Lay out a Triton backend directory: the Python backend plus our Python-based backends.

    Every folder under ``serving/backends`` (``onnxruntime``, ``pytorch``) becomes a backend of that
    name, so ``platform: "onnxruntime_onnx"`` and ``pytorch_libtorch`` configs load unchanged.
    """
    root = _pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    python_dir = target / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(root / "backends" / "python" / name, python_dir / name)
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonStartError(f"the Triton Python backend has no stub for Python {version}")
    shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    for backend in sorted(p for p in _BACKENDS_SOURCE.iterdir() if (p / "model.py").exists()):
        dest = target / backend.name
        dest.mkdir(exist_ok=True)
        shutil.copy2(backend / "model.py", dest / "model.py")
    return target


@dataclass
class TritonServer:
    """The embedded Triton server as a context manager.

    Args:
        repository: the model repository to serve.
        models: models to load at start (explicit model control); ``None`` loads every entry.
        ports: HTTP, gRPC and metrics ports.
        host: address to bind; 127.0.0.1 keeps Triton reachable only from this machine.
    """

    repository: Path
    models: Sequence[str] | None = None
    ports: TritonPorts = field(default_factory=TritonPorts)
    host: str = "127.0.0.1"
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    log_verbose: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _workdir: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)
    _log: deque[str] = field(default_factory=lambda: deque(maxlen=400), init=False, repr=False)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(list(self._log)[-lines:])

    def command(self, backend_dir: Path) -> list[str]:
        binary = _pytriton_root() / "bin" / "tritonserver"
        cmd = [
            str(binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backend_dir}",
            "--model-control-mode=explicit",
            f"--http-address={self.host}",
            f"--http-port={self.ports.http}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-on-error=true",
            f"--log-verbose={self.log_verbose}",
        ]
        for name in self.model_names():
            cmd.append(f"--load-model={name}")
        return cmd

    def model_names(self) -> list[str]:
        if self.models is not None:
            return list(self.models)
        return sorted(p.name for p in Path(self.repository).iterdir() if (p / "config.pbtxt").exists())

    def start(self) -> TritonServer:
        for label, port in (("HTTP", self.ports.http), ("gRPC", self.ports.grpc), ("metrics", self.ports.metrics)):
            if _port_taken(self.host, port):
                raise TritonStartError(
                    f"port {port} ({label}) on {self.host} is already in use; stop what holds it or pick another port"
                )
        missing = [m for m in self.model_names() if not (Path(self.repository) / m / "config.pbtxt").exists()]
        if missing:
            raise TritonStartError(f"not in the model repository {self.repository}: {', '.join(missing)}")
        self._workdir = tempfile.TemporaryDirectory(prefix="triton-backends-")
        backend_dir = assemble_backends(Path(self._workdir.name))
        self._process = subprocess.Popen(
            self.command(backend_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self._environment(),
            start_new_session=True,
        )
        threading.Thread(target=self._pump_log, daemon=True).start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        libs = _pytriton_root().parent.parent / "nvidia_pytriton.libs"
        # The stub links libpython3.X: take this interpreter's, not whichever the system has, so the
        # embedded interpreter matches the standard library and extension modules it will load.
        libpython = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), libpython, env.get("LD_LIBRARY_PATH")]))
        # The Python backend stub embeds its own interpreter, which takes its prefix (and so its
        # site-packages: a virtual environment's) from the first `python3` on PATH, and ignores
        # PYTHONPATH. Put this interpreter first, so models import what this environment has.
        env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*sys.path[1:], env.get("PYTHONPATH")]))
        return env

    def _pump_log(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for raw in self._process.stdout:
            self._log.append(raw.decode(errors="replace").rstrip())

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                time.sleep(0.2)  # let the log pump catch the last lines
                raise TritonStartError(self._failure_summary(f"Triton exited with code {self._process.returncode}"))
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        raise TritonStartError(self._failure_summary(f"Triton was not ready after {self.startup_timeout_s:.0f} s"))

    def _failure_summary(self, headline: str) -> str:
        lines = list(self._log)
        reasons = [line for line in lines if "failed to load" in line or "error:" in line.lower() or "E1" in line[:3]]
        detail = "\n".join(reasons[-10:] or lines[-30:])
        return f"{headline}\n{detail}"

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def kill(self) -> None:
        """Kill Triton abruptly, as a crash would (fault tests use this)."""
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def iter_log(self) -> Iterator[str]:
        return iter(list(self._log))
