"""Shared-memory regions for Triton's shared-memory extension, one implementation per kind.

With shared memory the request carries no tensor bytes: the client writes the inputs into a region
once, registers it with Triton, and every request names the region (perf_analyzer measures Triton
the same way, to take payload transfer out of a tensor-path figure). Inputs are read-only, so one
region per distinct payload serves every worker; each worker gets its own output region, so
concurrent answers never overwrite each other.

Kinds: ``system`` (POSIX shared memory, :mod:`tritonclient.utils.shared_memory`) and ``cuda`` (GPU
memory shared through CUDA IPC, :mod:`tritonclient.utils.cuda_shared_memory`, on a GPU host). A kind
is a class with the methods of :class:`SharedMemoryKind`, registered in :data:`KINDS`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "KINDS",
    "CudaSharedMemory",
    "Region",
    "SharedMemoryKind",
    "SystemSharedMemory",
    "region_name",
]


class Region:
    """One region: its name at Triton, its size and the kind's handle."""

    __slots__ = ("name", "byte_size", "handle")

    def __init__(self, name: str, byte_size: int, handle: Any) -> None:
        self.name = name
        self.byte_size = byte_size
        self.handle = handle


class SharedMemoryKind(Protocol):
    """What a shared-memory kind provides; ``client`` is a tritonclient aio client (HTTP or gRPC)."""

    def create(self, name: str, byte_size: int) -> Region: ...

    def write(self, region: Region, arrays: Sequence[np.ndarray]) -> None: ...

    def read(
        self, region: Region, datatype: str, shape: Sequence[int], offset: int = 0
    ) -> np.ndarray: ...

    async def register(self, client: Any, region: Region) -> None: ...

    async def unregister(self, client: Any, region: Region) -> None: ...

    def destroy(self, region: Region) -> None: ...


def region_name(label: str) -> str:
    """A name no other process or run uses (Triton's region names are server-wide)."""
    return f"loadgen-{os.getpid()}-{uuid.uuid4().hex[:8]}-{label}"


class SystemSharedMemory:
    """POSIX shared memory (``/dev/shm``): Triton on the same host maps the same pages."""

    def __init__(self) -> None:
        import tritonclient.utils.shared_memory as shm

        self._shm = shm

    def create(self, name: str, byte_size: int) -> Region:
        return Region(
            name, byte_size, self._shm.create_shared_memory_region(name, "/" + name, byte_size)
        )

    def write(self, region: Region, arrays: Sequence[np.ndarray]) -> None:
        self._shm.set_shared_memory_region(region.handle, [np.ascontiguousarray(a) for a in arrays])

    def read(
        self, region: Region, datatype: str, shape: Sequence[int], offset: int = 0
    ) -> np.ndarray:
        from tritonclient.utils import triton_to_np_dtype

        return np.asarray(
            self._shm.get_contents_as_numpy(
                region.handle, triton_to_np_dtype(datatype), list(shape), offset
            )
        )

    async def register(self, client: Any, region: Region) -> None:
        await client.register_system_shared_memory(region.name, "/" + region.name, region.byte_size)

    async def unregister(self, client: Any, region: Region) -> None:
        await client.unregister_system_shared_memory(region.name)

    def destroy(self, region: Region) -> None:
        self._shm.destroy_shared_memory_region(region.handle)


class CudaSharedMemory:
    """CUDA shared memory: a region in GPU memory that Triton opens through a CUDA IPC handle, so the
    tensors reach a GPU model without crossing the host (perf_analyzer's ``--shared-memory cuda``).

    Needs ``cuda-python`` (``cuda.bindings``) and a GPU on the client's host; each client process
    allocates its own regions on ``device_id``.
    """

    def __init__(self, device_id: int = 0) -> None:
        import tritonclient.utils.cuda_shared_memory as cudashm

        self._shm = cudashm
        self.device_id = device_id

    def create(self, name: str, byte_size: int) -> Region:
        return Region(
            name, byte_size, self._shm.create_shared_memory_region(name, byte_size, self.device_id)
        )

    def write(self, region: Region, arrays: Sequence[np.ndarray]) -> None:
        self._shm.set_shared_memory_region(region.handle, [np.ascontiguousarray(a) for a in arrays])

    def read(
        self, region: Region, datatype: str, shape: Sequence[int], offset: int = 0
    ) -> np.ndarray:
        from tritonclient.utils import triton_to_np_dtype

        dtype = np.dtype(triton_to_np_dtype(datatype))
        count = int(np.prod(shape)) if len(shape) else 1
        flat = self._shm.get_contents_as_numpy(region.handle, np.uint8, [region.byte_size])
        return np.frombuffer(
            flat.tobytes()[offset : offset + count * dtype.itemsize], dtype=dtype
        ).reshape(shape)

    async def register(self, client: Any, region: Region) -> None:
        await client.register_cuda_shared_memory(
            region.name, self._shm.get_raw_handle(region.handle), self.device_id, region.byte_size
        )

    async def unregister(self, client: Any, region: Region) -> None:
        await client.unregister_cuda_shared_memory(region.name)

    def destroy(self, region: Region) -> None:
        self._shm.destroy_shared_memory_region(region.handle)


KINDS: dict[str, Callable[[], SharedMemoryKind]] = {
    "system": SystemSharedMemory,
    "cuda": CudaSharedMemory,
}
"""Shared-memory kinds by name (``TritonTarget(shared_memory=...)``)."""
