"""How much memory a Triton instance holds: the reading the residency budget is checked against.

Two sources, one per device kind (``GATEWAY_RESIDENCY_MEMORY``):

- ``process`` (CPU): the resident set size of the ``tritonserver`` process and all its children,
  read with psutil. Each Python-backend model instance (our ONNX Runtime and TorchScript shims too)
  is a stub process of its own, so a model's memory shows up in the tree and leaves with the stub
  when the model unloads. RSS counts pages shared between stubs once per stub, so the figure errs
  high (the safe side for a budget). It needs the gateway on Triton's host: the pid is configured,
  or found as the ``tritonserver`` process whose command line names Triton's HTTP port.
- ``gpu``: the sum of Triton's ``nv_gpu_memory_used_bytes`` gauges from its metrics endpoint (what
  NVML says every process on those GPUs uses), for a gateway in another container or pod.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import aiohttp
import psutil

__all__ = [
    "GpuMetricsMeter",
    "MemoryMeter",
    "ProcessTreeMeter",
    "find_triton_pid",
    "parse_gpu_used",
]

_GPU_GAUGE = "nv_gpu_memory_used_bytes"


class MemoryMeter(Protocol):
    """Reads how many bytes the Triton instance holds now."""

    async def used_bytes(self) -> int: ...

    async def close(self) -> None: ...


def find_triton_pid(http_port: int) -> int | None:
    """The pid of the ``tritonserver`` process serving HTTP on ``http_port`` (``None``: none found)."""
    wanted = f"--http-port={http_port}"
    for proc in psutil.process_iter(["name", "cmdline"]):
        info = proc.info
        if info.get("name") == "tritonserver" and wanted in (info.get("cmdline") or []):
            return int(proc.pid)
    return None


def _tree_rss(pid: int) -> int:
    root = psutil.Process(pid)
    total = 0
    for proc in (root, *root.children(recursive=True)):
        try:
            total += int(proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # a stub exiting as we read
            continue
    return total


class ProcessTreeMeter:
    """RSS of a process and its children (off the event loop: psutil reads /proc).

    Args:
        pid: the ``tritonserver`` process.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid

    async def used_bytes(self) -> int:
        return await asyncio.to_thread(_tree_rss, self.pid)

    async def close(self) -> None:
        return None


def parse_gpu_used(text: str) -> int:
    """The sum of every ``nv_gpu_memory_used_bytes`` sample in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(_GPU_GAUGE) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


class GpuMetricsMeter:
    """GPU memory in use, from Triton's metrics endpoint.

    Triton refreshes its GPU gauges every ``--metrics-interval-ms`` (100 ms as the launcher starts
    it with GPU metrics), so a read right after a load or an unload can show the memory before it:
    each read first waits ``settle_s``, longer than one refresh. Each read opens its own session:
    aiohttp binds a session to the running event loop, and a benchmark reads from several
    ``asyncio.run`` calls; a loopback connection per read costs far less than the settle wait.

    Args:
        metrics_url: e.g. ``http://127.0.0.1:8002/metrics``.
        timeout_s: the deadline of one read.
        settle_s: the wait before each read (0: read at once).
    """

    def __init__(self, metrics_url: str, timeout_s: float = 2.0, settle_s: float = 0.3) -> None:
        self.metrics_url = metrics_url
        self.settle_s = settle_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def used_bytes(self) -> int:
        if self.settle_s > 0:
            await asyncio.sleep(self.settle_s)
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            async with session.get(self.metrics_url) as resp:
                resp.raise_for_status()
                return parse_gpu_used(await resp.text())

    async def close(self) -> None:
        """Nothing to release: each read closes its own session."""
