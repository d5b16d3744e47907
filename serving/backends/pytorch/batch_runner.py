"""Run one module on whole batches on one device: pinned staging, CUDA graphs, padded batch sizes.

What the prototype on an H200 taught (issue 16): a GPU model served batch by batch spends its time
around the model, not in it. Every batch size new to the GPU stalled an instance for hundreds of
milliseconds (P99 of seconds); a batch gathered request by request paid one host->device copy per
request; an eager forward of a small CNN is launch-bound below batch 64. So:

- the batch sizes are fixed at load (:func:`capture_sizes`); a batch of ``n`` runs at the smallest
  captured size ``>= n`` (the padding rows hold whatever the last batch left there and their
  outputs are never read);
- each captured size is one CUDA graph, captured once at load from static input buffers, all graphs
  sharing one memory pool (so the memory is that of the largest batch, not their sum);
- host inputs are gathered into one pinned staging buffer and cross to the GPU in ONE asynchronous
  copy per input per batch; inputs already on the GPU (CUDA shared memory, an earlier GPU step)
  are copied device to device;
- all of it runs on the runner's own stream, so a copy of one batch can overlap another's compute
  when several runners share a process;
- host bytes are moved by one plain ``memcpy`` per request (:func:`host_copy`), never by ATen's
  ``copy_``/``cat``, which split a large copy across the process's OpenMP threads: on a busy host
  every such parallel region waits at a barrier for threads the scheduler has not run yet. Profiled
  on the CPU (py-spy, the same entry on ``KIND_CPU``, a model that does nothing): 80% of the stub's
  time was ``torch.cat`` of the requests, most of it in libgomp, and the entry answered at 0.2x of
  the load generator's capacity.

Only torch is imported: no numpy (the embedded Triton 2.51 Python stub exchanges numpy arrays
incorrectly under numpy 2, see ``model.py``), no Triton. The pytorch backend imports this file as
a sibling module (Triton puts a Python-based backend's folder on ``sys.path``); the builders copy it
beside GPU pipeline models.
"""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "DEFAULT_CAPTURE_SIZES",
    "BatchRunner",
    "InputSpec",
    "capture_sizes",
    "host_cat",
    "host_copy",
]

#: sizes a batch is padded up to: dense where padding would waste most, about 1/8 apart above 16
DEFAULT_CAPTURE_SIZES: tuple[int, ...] = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
)

Forward = Callable[..., Sequence[torch.Tensor]]


def capture_sizes(
    max_batch: int, preferred: Sequence[int] = (), sizes: Sequence[int] = DEFAULT_CAPTURE_SIZES
) -> tuple[int, ...]:
    """The batch sizes to prepare for: ``sizes`` and the preferred sizes up to ``max_batch``, and
    ``max_batch`` itself (Triton can form any batch up to it, server#8141)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    chosen = {s for s in (*sizes, *preferred) if 0 < s <= max_batch}
    chosen.add(max_batch)
    return tuple(sorted(chosen))


def host_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[...] = src`` for host tensors as one single-threaded ``memcpy`` (see the module's
    docstring for why not ``copy_``); any other pair (device memory, strides, dtype or shape that
    differ) falls back to ``copy_``."""
    if (
        dst.is_cuda
        or src.is_cuda
        or dst.dtype != src.dtype
        or dst.shape != src.shape
        or not dst.is_contiguous()
        or not src.is_contiguous()
    ):
        dst.copy_(src)
        return
    nbytes = src.numel() * src.element_size()
    if nbytes:
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)


def host_cat(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` along the first axis for host tensors, by :func:`host_copy`."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    out = torch.empty((sum(int(p.shape[0]) for p in parts), *first.shape[1:]), dtype=first.dtype)
    start = 0
    for part in parts:
        stop = start + int(part.shape[0])
        host_copy(out[start:stop], part)
        start = stop
    return out


@dataclass(frozen=True)
class InputSpec:
    """One input of the module: its shape without the batch axis and the dtype it arrives in."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class BatchRunner:
    """``forward`` on ``device`` at fixed batch sizes, from static input buffers.

    Args:
        forward: takes one batched tensor per input (in ``inputs`` order, arriving dtype) and returns
            the output tensors; dtype and memory-format conversions belong inside it, so they are
            captured into the graph too.
        inputs: the inputs' per-item shapes and dtypes.
        device: where to run. On the CPU there is no staging and no graph: ``forward`` runs on the
            exact batch.
        batch_sizes: the sizes to prepare (see :func:`capture_sizes`); the last is the largest batch.
        cuda_graphs: capture one CUDA graph per size at construction; otherwise ``forward`` runs
            eagerly at the padded size (still one shape per size, so nothing is re-tuned).
    """

    def __init__(
        self,
        forward: Forward,
        inputs: Sequence[InputSpec],
        device: torch.device,
        batch_sizes: Sequence[int],
        cuda_graphs: bool = True,
    ) -> None:
        if not batch_sizes or sorted(batch_sizes) != list(batch_sizes) or batch_sizes[0] < 1:
            raise ValueError(
                f"batch_sizes must be ascending positive sizes, got {list(batch_sizes)}"
            )
        self.forward = forward
        self.inputs = list(inputs)
        self.device = device
        self.sizes = tuple(batch_sizes)
        self.max_batch = self.sizes[-1]
        self.cuda = device.type == "cuda"
        self.cuda_graphs = cuda_graphs and self.cuda
        self.capture_error = ""  # why CUDA graphs were given up, if they were
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._static = [
            torch.zeros((self.max_batch, *i.shape), dtype=i.dtype, device=device)
            for i in self.inputs
        ]
        if not self.cuda:
            self.stream = None
            return
        self.stream = torch.cuda.Stream(device)
        self._staging = [
            torch.zeros((self.max_batch, *i.shape), dtype=i.dtype).pin_memory() for i in self.inputs
        ]
        self._staged = (
            torch.cuda.Event()
        )  # the last staging->device copy; staging is reused after it
        self._staged.record(self.stream)
        self._prepare()

    # ------------------------------------------------------------------ load time

    def _prepare(self) -> None:
        """Run every size once (cuDNN picks its algorithms, the allocator grows), then capture."""
        assert self.stream is not None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            for size in self.sizes:
                for _ in range(2):
                    self.forward(*(x[:size] for x in self._static))
        self.stream.synchronize()
        if not self.cuda_graphs:
            return
        pool = None
        try:
            with torch.inference_mode():
                for size in reversed(self.sizes):  # largest first: the smaller ones fit in its pool
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                        outputs = tuple(self.forward(*(x[:size] for x in self._static)))
                    pool = graph.pool()
                    self._graphs[size] = (graph, outputs)
            self.stream.synchronize()
        except RuntimeError as exc:  # a module that cannot be captured still runs, eagerly
            self._graphs.clear()
            self.cuda_graphs = False
            self.capture_error = f"{type(exc).__name__}: {exc}"[:300]
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ per batch

    def bucket(self, n: int) -> int:
        """The prepared size a batch of ``n`` runs at."""
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"a batch of {n} is outside 1..{self.max_batch}")
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def run_parts(self, parts: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """Concatenate per-request inputs (``parts[request][input]``, each ``[k, *shape]``, on the host
        or on the device), run once, and return the outputs of all rows (on the device for CUDA;
        views into static buffers, valid until the next run: copy what you keep)."""
        sizes = [int(p[0].shape[0]) for p in parts]
        n = sum(sizes)
        if not self.cuda:
            with torch.inference_mode():
                merged = [host_cat([p[i] for p in parts]) for i in range(len(self.inputs))]
                return [o for o in self.forward(*merged)]
        return self.run(n, lambda rows: self._gather(parts, sizes, rows))

    def run(self, n: int, fill: Callable[[list[torch.Tensor]], object]) -> list[torch.Tensor]:
        """Let ``fill`` write rows ``[:n]`` of the static inputs (on the runner's stream), then run
        the padded batch. Returns output views of the first ``n`` rows (see :meth:`run_parts`)."""
        size = self.bucket(n)
        if self.stream is None:  # CPU: no padding, nothing captured
            with torch.inference_mode():
                fill([x[:n] for x in self._static])
                return list(self.forward(*(x[:n] for x in self._static)))
        self.stream.wait_stream(
            torch.cuda.current_stream(self.device)
        )  # inputs made on the default stream
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            fill([x[:n] for x in self._static])
            if self.cuda_graphs:
                graph, outputs = self._graphs[size]
                graph.replay()
            else:
                outputs = tuple(self.forward(*(x[:size] for x in self._static)))
        return [o[:n] for o in outputs]

    def _gather(
        self,
        parts: Sequence[Sequence[torch.Tensor]],
        sizes: Sequence[int],
        rows: list[torch.Tensor],
    ) -> None:
        assert self.stream is not None
        offsets = [0]
        for k in sizes:
            offsets.append(offsets[-1] + k)
        n = offsets[-1]
        host = [any(not p[i].is_cuda for p in parts) for i in range(len(self.inputs))]
        if any(host):
            self._staged.synchronize()  # the previous batch's copy out of staging has finished
        for i, row in enumerate(rows):
            if host[i]:
                staging = self._staging[i]
                for p, start, stop in zip(parts, offsets[:-1], offsets[1:], strict=True):
                    if not p[i].is_cuda:
                        host_copy(staging[start:stop], p[i])
                row.copy_(staging[:n], non_blocking=True)  # the one host->device copy of this input
            device_parts = [p[i] for p in parts if p[i].is_cuda]
            if len(device_parts) == len(parts) > 1:
                # One launch for the whole batch where a copy per request would be one launch each
                # (CUDA shared memory: a request's tensor is on the device already).
                torch.cat(device_parts, out=row)
                continue
            for p, start, stop in zip(parts, offsets[:-1], offsets[1:], strict=True):
                if p[i].is_cuda:
                    row[start:stop].copy_(p[i], non_blocking=True)
        if any(host):
            self._staged.record(self.stream)

    def to_host(self, tensors: Sequence[torch.Tensor], wait: bool = True) -> list[torch.Tensor]:
        """Copy device outputs into pinned host memory (one copy each) and wait for them; with
        ``wait=False`` the copies are only queued behind the run on the runner's stream (so the next
        run may reuse the static outputs) and the host tensors are valid after :meth:`synchronize`."""
        if not self.cuda:
            return list(tensors)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for h, t in zip(host, tensors, strict=True):
                h.copy_(t, non_blocking=True)
        if wait:
            self.stream.synchronize()
        return host

    def synchronize(self) -> None:
        """Wait for everything queued on the runner's stream (runs and copies)."""
        if self.stream is not None:
            self.stream.synchronize()

    def to_device(self, tensors: Sequence[torch.Tensor], wait: bool = True) -> list[torch.Tensor]:
        """Own copies of device outputs that outlive the next run, ready when this returns (with
        ``wait=False``: after :meth:`synchronize`)."""
        if not self.cuda:
            return list(tensors)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            owned = [t.clone() for t in tensors]
        if wait:
            self.stream.synchronize()
        return owned
