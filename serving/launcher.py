"""Run the real Triton Inference Server binary that ships in the ``nvidia-pytriton`` wheel.

Used when no NGC container is at hand (a laptop, CI, a box without Docker). The server runs in
explicit model-control mode, binds to 127.0.0.1 unless told otherwise, and is only handed back
once it and every requested model are READY. Failures come back as :class:`TritonStartError`
with the part of Triton's log that explains them.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from serving.ports import reserve_ports
from serving.processes import ManagedProcess, ProcessStartError, http_ready
from serving.stub_watch import remove_regions, stub_processes

__all__ = ["TritonPorts", "TritonServer", "TritonStartError", "assemble_backends"]

_BACKENDS_SOURCE = Path(__file__).parent / "backends"
#: the batching core every Python-based backend imports (and the module it imports); Triton puts only
#: the backend's own folder on sys.path, so a copy of each goes beside each backend's model.py
SHARED_MODULES = (
    _BACKENDS_SOURCE / "batching_core.py",
    _BACKENDS_SOURCE / "ragged_groups.py",
    _BACKENDS_SOURCE.parent / "step_metrics.py",
)
DEFAULT_STARTUP_TIMEOUT_S = 180.0


class TritonStartError(ProcessStartError):
    """Triton did not come up: a port was taken, the binary is missing, or a model failed to load."""


@dataclass(frozen=True)
class TritonPorts:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> TritonPorts:
        """Three distinct ports reserved for this process (see :mod:`serving.ports` for why that is
        race-free), for tests and side-by-side runs."""
        http, grpc, metrics = reserve_ports(3, host)
        return cls(http=http, grpc=grpc, metrics=metrics)


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
        raise TritonStartError(
            "nvidia-pytriton is not installed; run ./run up to install it"
        ) from exc
    return Path(pytriton.__file__).parent / "tritonserver"


def assemble_backends(target: Path) -> Path:
    """Lay out a Triton backend directory: the Python backend plus our Python-based backends.

    Every folder under ``serving/backends`` (``onnxruntime``, ``pytorch``) becomes a backend of that
    name, so ``platform: "onnxruntime_onnx"`` and ``pytorch_libtorch`` configs load unchanged. Each
    gets its ``model.py``, its other modules and a copy of the shared :data:`SHARED_MODULES` beside it
    (the stub puts the backend's folder on ``sys.path``, so ``model.py`` imports them by name).
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
        for module in sorted(backend.glob("*.py")):  # model.py and the modules beside it
            shutil.copy2(module, dest / module.name)
        for shared in SHARED_MODULES:
            shutil.copy2(shared, dest / shared.name)
    return target


@dataclass
class TritonServer:
    """The embedded Triton server as a context manager.

    Args:
        repository: the model repository to serve.
        models: models to load at start (explicit model control); ``None`` loads every entry.
        ports: HTTP, gRPC and metrics ports.
        host: address to bind; 127.0.0.1 keeps Triton reachable only from this machine.
        python: the interpreter whose environment (site-packages) the Python models run in; this
            one by default. The Python stub takes its environment from the first ``python3`` on
            PATH and ignores PYTHONPATH, so this is how models get another environment (e.g. numpy
            1.x, which the 2.51 stub needs for string tensors, beside a GPU host's numpy 2).
        gpu_metrics: publish ``nv_gpu_*`` metrics (DCGM, bundled with the wheel), refreshed every
            100 ms rather than Triton's 2 s, so a memory reading just after a load sees the load.
        cuda_memory_pool_mb: Triton's CUDA memory pool on GPU 0, in MiB (0: Triton's default, 64).
            The Python backend hands GPU inputs to its stub through this pool; an input that does
            not fit takes a slower path. A batch of 114 FP32 224x224 images is 68.6 MB.
    """

    repository: Path
    models: Sequence[str] | None = None
    ports: TritonPorts = field(default_factory=TritonPorts)
    host: str = "127.0.0.1"
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    log_verbose: int = 0
    python: str | None = None
    gpu_metrics: bool = False
    cuda_memory_pool_mb: int = 0
    _process: ManagedProcess | None = field(default=None, init=False, repr=False)
    _workdir: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)

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
        return self._process.log_tail(lines) if self._process else ""

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
            f"--allow-gpu-metrics={'true' if self.gpu_metrics else 'false'}",
            *(["--metrics-interval-ms=100"] if self.gpu_metrics else []),
            "--strict-readiness=true",
            *(
                [f"--cuda-memory-pool-byte-size=0:{self.cuda_memory_pool_mb << 20}"]
                if self.cuda_memory_pool_mb
                else []
            ),
            # Every entry's config is complete (the builders write it). With auto-complete on, the
            # Python backend starts a second stub per model load only to ask it for a config: on the
            # H100 host a load took 4.27 s with it, and one stub's start is 1.8 s
            # (benchmarks/multimodel/README.md).
            "--disable-auto-complete-config",
            "--exit-on-error=true",
            f"--log-verbose={self.log_verbose}",
        ]
        for name in self.model_names():
            cmd.append(f"--load-model={name}")
        return cmd

    def model_names(self) -> list[str]:
        if self.models is not None:
            return list(self.models)
        return sorted(
            p.name for p in Path(self.repository).iterdir() if (p / "config.pbtxt").exists()
        )

    def start(self) -> TritonServer:
        if self.running():
            raise TritonStartError(f"Triton is already running (pid {self.pid})")
        self.stop()  # after a crash or kill(): reap what is left and drop the old backend folder
        for label, port in (
            ("HTTP", self.ports.http),
            ("gRPC", self.ports.grpc),
            ("metrics", self.ports.metrics),
        ):
            if _port_taken(self.host, port):
                raise TritonStartError(
                    f"port {port} ({label}) on {self.host} is already in use; stop what holds it "
                    "or pick another port"
                )
        missing = [
            m
            for m in self.model_names()
            if not (Path(self.repository) / m / "config.pbtxt").exists()
        ]
        if missing:
            raise TritonStartError(
                f"not in the model repository {self.repository}: {', '.join(missing)}"
            )
        self._workdir = tempfile.TemporaryDirectory(prefix="triton-backends-")
        backend_dir = assemble_backends(Path(self._workdir.name))
        self._process = ManagedProcess(
            self.command(backend_dir), name="Triton", env=self._environment()
        )
        try:
            self._process.start()
            self._process.wait_until(
                http_ready(f"http://{self.http_url}/v2/health/ready"), self.startup_timeout_s
            )
        except ProcessStartError as exc:
            self.stop()
            raise TritonStartError(self._failure_summary(str(exc).split("\n", 1)[0])) from None
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
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(libs), libpython, env.get("LD_LIBRARY_PATH")])
        )
        # The Python backend stub embeds its own interpreter, which takes its prefix (and so its
        # site-packages: a virtual environment's) from the first `python3` on PATH, and ignores
        # PYTHONPATH. Put this interpreter first, so models import what this environment has.
        env["PATH"] = os.pathsep.join(
            filter(None, [str(Path(self.python or sys.executable).parent), env.get("PATH")])
        )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*sys.path[1:], env.get("PYTHONPATH")]))
        return env

    def _failure_summary(self, headline: str) -> str:
        lines = self._process.log_lines() if self._process else []
        reasons = [
            line
            for line in lines
            if "failed to load" in line or "error:" in line.lower() or "E1" in line[:3]
        ]
        detail = "\n".join(reasons[-10:] or lines[-30:])
        return f"{headline}\n{detail}"

    def running(self) -> bool:
        return self._process is not None and self._process.running()

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._process is not None:
            # Triton leaves its stubs' shared memory in /dev/shm even at shutdown: note it, remove it after.
            pid = self._process.pid
            regions = (
                {stub.region for stub in stub_processes(pid)}
                if pid and self._process.running()
                else set()
            )
            self._process.stop(timeout_s)
            remove_regions(regions)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def kill(self) -> None:
        """Kill Triton abruptly, as a crash would (fault tests use this)."""
        if self._process is not None:
            self._process.kill()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def iter_log(self) -> Iterator[str]:
        return iter(self._process.log_lines() if self._process else [])
