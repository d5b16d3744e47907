"""The Triton host's side of healing: each model's Python stub under a memory limit, and no
shared memory left behind by a stub that is gone.

Every model instance the Python backend runs (our Python-based ``onnxruntime`` and ``pytorch``
backends included) is a ``triton_python_backend_stub`` child of ``tritonserver``, started as::

    triton_python_backend_stub <repository>/<model>/<version>/<file> <shm region> <size>
        <growth> <parent pid> ...

and talks to Triton through one POSIX shared-memory region, ``/dev/shm/<shm region>``
(``triton_<backend>_backend_shm_region_<uuid>``). Triton does not remove the region when a stub dies
or its model is reloaded or unloaded, nor at shutdown, so a host that heals stubs would fill
``/dev/shm`` (a RAM-backed file system). :class:`StubWatch`, polled by the supervisor:

- removes the region of every stub that has exited (once no live stub names it);
- kills a stub whose resident memory passes its limit, so one model cannot take the host: that
  stub dies alone, exactly as the kernel's OOM killer would end it, and the gateway reloads its model
  (:mod:`gateway.backends.model_healer`). The limit is the model config's ``stub_memory_limit_mb`` parameter,
  else ``TRITON_STUB_MEMORY_LIMIT_MB``, else half the host's memory; 0 turns it off.

A watch, not an ``rlimit`` inside the stub: the stubs of Python-backend models run files we do not
wrap (and an address-space limit breaks the allocators of onnxruntime and torch, which reserve far
more than they use); the watch sees every stub the same way. In Kubernetes, where no supervisor runs,
the container's memory limit plays this part for the pod as a whole.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = [
    "MEMORY_LIMIT_ENV",
    "MEMORY_LIMIT_PARAMETER",
    "SHM_DIR",
    "Stub",
    "StubWatch",
    "remove_regions",
    "stub_processes",
]

log = logging.getLogger("serving.stub_watch")

STUB_BINARY = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
MEMORY_LIMIT_PARAMETER = "stub_memory_limit_mb"
MEMORY_LIMIT_ENV = "TRITON_STUB_MEMORY_LIMIT_MB"
_MB = 1024 * 1024


@dataclass(frozen=True)
class Stub:
    """One live stub process.

    Attributes:
        pid: its process id.
        model: the model it serves an instance of.
        model_dir: that model's folder in the repository.
        region: the name of its shared-memory region under ``/dev/shm``.
    """

    pid: int
    model: str
    model_dir: Path
    region: str


def stub_processes(triton_pid: int) -> list[Stub]:
    """The stubs Triton ``triton_pid`` runs now (empty when it is gone)."""
    try:
        children = psutil.Process(triton_pid).children(recursive=True)
    except psutil.Error:
        return []
    stubs = []
    for child in children:
        try:
            args = child.cmdline()
        except psutil.Error:  # exited meanwhile
            continue
        if len(args) < 3 or Path(args[0]).name != STUB_BINARY:
            continue
        model_dir = Path(args[1]).parent.parent
        stubs.append(Stub(child.pid, model_dir.name, model_dir, args[2]))
    return stubs


def remove_regions(regions: set[str]) -> list[str]:
    """Unlink these shared-memory regions where they still exist; the names removed."""
    removed = []
    for region in sorted(regions):
        if "/" in region or not region.startswith("triton_"):
            continue  # only what a stub's command line named, and never a path
        try:
            (SHM_DIR / region).unlink()
            removed.append(region)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove /dev/shm/%s: %s", region, exc)
    return removed


def _config_limit_mb(model_dir: Path) -> int | None:
    """``stub_memory_limit_mb`` from the model's config.pbtxt, if it sets one."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    try:
        config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError):
        return None
    value = config.parameters.get(MEMORY_LIMIT_PARAMETER)
    text = value.string_value.strip() if value is not None else ""
    return int(text) if text.isdigit() else None


def default_limit_mb(environ: Mapping[str, str] = os.environ) -> int:
    """The limit of a stub whose model sets none: the environment's, else half the host's memory."""
    text = environ.get(MEMORY_LIMIT_ENV, "").strip()
    if text.isdigit():
        return int(text)
    return int(psutil.virtual_memory().total // 2 // _MB)


@dataclass
class StubWatch:
    """Watches the stubs of one Triton process (the module docstring says what it does).

    Args:
        triton_pid: the ``tritonserver`` process.
        default_limit_mb: the memory limit of a stub whose model sets none (0: none).
    """

    triton_pid: int
    default_limit_mb: int = field(default_factory=default_limit_mb)
    killed: list[Stub] = field(default_factory=list)
    _regions: dict[tuple[int, str], Stub] = field(default_factory=dict, init=False, repr=False)
    _limits: dict[Path, int] = field(default_factory=dict, init=False, repr=False)

    def limit_mb(self, stub: Stub) -> int:
        """The memory limit of ``stub`` in MiB (0: none)."""
        if stub.model_dir not in self._limits:
            configured = _config_limit_mb(stub.model_dir)
            self._limits[stub.model_dir] = (
                self.default_limit_mb if configured is None else configured
            )
        return self._limits[stub.model_dir]

    def poll(self) -> list[str]:
        """One look: enforce the memory limits, remove the regions of stubs that are gone.

        Returns:
            The regions removed by this look.
        """
        live = stub_processes(self.triton_pid)
        for stub in live:
            self._regions.setdefault((stub.pid, stub.region), stub)
            self._enforce(stub)
        # Keyed by pid and region: a new stub that reuses a dead one's pid must not hide the dead
        # one's region (it would never be removed).
        alive = {(stub.pid, stub.region) for stub in live}
        gone = [stub for key, stub in self._regions.items() if key not in alive]
        for stub in gone:
            del self._regions[(stub.pid, stub.region)]
        named = {stub.region for stub in live}
        removed = remove_regions({stub.region for stub in gone} - named)
        for region in removed:
            log.info("removed /dev/shm/%s (its stub is gone)", region)
        return removed

    def _enforce(self, stub: Stub) -> None:
        limit = self.limit_mb(stub)
        if not limit:
            return
        try:
            rss = psutil.Process(stub.pid).memory_info().rss
        except psutil.Error:
            return
        if rss <= limit * _MB:
            return
        log.error(
            "model %r: stub %d uses %d MiB, over its limit of %d MiB; killing it (the model is reloaded)",
            stub.model,
            stub.pid,
            rss // _MB,
            limit,
        )
        try:
            os.kill(stub.pid, signal.SIGKILL)
            self.killed.append(stub)
        except ProcessLookupError:
            pass

    def release(self) -> list[str]:
        """After Triton has stopped: remove the regions of every stub this watch has seen."""
        regions = {stub.region for stub in self._regions.values()}
        self._regions.clear()
        return remove_regions(regions)
