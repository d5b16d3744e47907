"""What one GPU benchmark run does (:class:`GpuBenchSettings`), below the run and its setup steps
(:mod:`loadtest.bench.gpu`, :mod:`loadtest.bench.gpu_setup`), which both read it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GpuBenchSettings"]


@dataclass(frozen=True, kw_only=True)
class GpuBenchSettings:
    """What one GPU run does; the defaults are the published run's."""

    out_dir: Path
    #: closed-loop concurrency of each configuration (the targets compare like with like: batching
    #: on/off and the naive server at 32, the JPEG paths where P99 <= 20 ms can hold)
    points: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {
            "tensor http": (32, 128, 256),
            "tensor system-shm": (128, 256),
            "tensor cuda-shm": (32, 128, 256),
            "tensor cuda-shm x8": (32, 64),
            "tensor compiled cuda-shm": (32, 256),
            "tensor no-batching": (32,),
            "tensor no-batching cuda-shm": (32,),
            "naive": (32,),
            "jpeg": (32, 64, 128, 256),
            "jpeg compiled": (32, 64, 128),
            "jpeg overlap": (32, 64, 128, 256),
            "jpeg compiled overlap": (32, 64, 128, 256),
            "jpeg gateway": (32, 64, 128, 256),
        }
    )
    duration_s: float = 3.0
    warmup_s: float = 1.0
    capacity_s: float = 2.0
    clients: int = 6
    gateway_workers: int = 0  # 0: a quarter of the cores, at least 1
    raw_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    raw_seconds: float = 0.4
    sweep: bool = True
    #: the configurations whose entries the sweep tunes, in this order (each at one concurrency)
    sweep_configs: tuple[str, ...] = ("jpeg", "tensor cuda-shm")
    #: the compiled flavour built and served beside TorchScript (builders/compiled.py); "": none
    compiled: str = "inductor"
    #: seconds the whole run may take (0: no limit); what would not fit is reported as not run
    budget_s: float = 0.0
    quick: bool = False
    #: ``cpu`` proves the machinery on a machine without a GPU (entries on KIND_CPU, no ceiling, no
    #: CUDA shared memory; the dry run in loadtest/gpu_bench.sh's header): its figures mean nothing
    device: str = "cuda"
    #: Triton's CUDA memory pool in MiB (0: Triton's default); see serving.launcher.TritonServer
    cuda_pool_mb: int = 0
    #: the instant twins' stub processes on the GPU (loadtest.loadgen.capacity; the CPU dry run keeps
    #: its default, four). With CUDA shared-memory inputs the twin pays Triton's input step per
    #: execution too: four stubs gave the tensor path at 32 in flight a capacity of only 1.36x its
    #: throughput (H100 run 12), against 4x and more at 256.
    twin_instances: int = 8
    #: instances of the tensor entry on the GPU (and of its no-batching twin). Three measured best of
    #: the sweep's candidates at 64 in flight (H100 run 12), but at 256 six did better in one call
    #: (H100 run 15: 7,213 against 6,382 images/s over CUDA shared memory, 7,599 against 3,794 over
    #: system shared memory), and with six the on/off pair at 32 still kept 5.07x (run 16)
    tensor_instances: int = 6

    def workers(self) -> int:
        """Gateway processes: as asked, else a quarter of the cores where the gateway can run several
        (``gateway --workers``, state shared through Redis), else one."""
        from gateway.settings import GatewaySettings

        if self.gateway_workers:
            return self.gateway_workers
        return max(1, (os.cpu_count() or 4) // 4) if hasattr(GatewaySettings, "worker_count") else 1
