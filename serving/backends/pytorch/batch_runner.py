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
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "DEFAULT_CAPTURE_SIZES",
    "MODULE_FILES",
    "BatchRunner",
    "InputSpec",
    "TorchModule",
    "capture_sizes",
    "cpu_share",
    "host_cat",
    "host_copy",
    "module_kind",
    "utf8_text_files",
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


#: the files :class:`TorchModule` loads, by name: what each holds
MODULE_FILES = {
    "model.pt": "TorchScript (torch.jit), the native libtorch backend's format too",
    "model.pt2": "an AOTInductor package (builders/compiled.py --flavour aoti)",
    "exported.pt2": "a torch.export program, compiled by torch.compile at load (builders/compiled.py)",
}


def cpu_share(config: dict[str, Any]) -> int:
    """ATen threads for one CPU instance of a model (``config``: Triton's model config as JSON): its
    share of the cores this process may use.

    ATen's default is every core for each instance. Two instances then run twice as many OpenMP
    threads as cores, and each OpenMP team spins at its barriers for threads the scheduler has given
    to the other process (it does not know they share the cores). Measured on 2 cores (the GPU
    benchmark's CPU dry run, concurrency 2, two instances): the TorchScript classifier went from 26
    requests/s at P99 290 ms to 42-51/s at P99 50-60 ms with one thread each; the CPU twin of the GPU
    pipeline, with two threads each, ran 45-52/s in three runs and 1/s in a fourth (403 ms of CPU per
    request, both cores busy), and with one thread each 30-31/s in three runs of three
    (``benchmarks/cpu/gpu-bench-dry-run``).
    """
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    return max(1, len(os.sched_getaffinity(0)) // instances)


def utf8_text_files() -> None:
    """Make ``open()``'s default encoding UTF-8 in this process, where the locale allows it.

    A Triton Python stub starts its interpreter isolated, in the C locale, whatever ``LANG`` says:
    text files open as ASCII there, and Inductor reads its (UTF-8) kernel templates that way
    (``UnicodeDecodeError`` at ``torch.compile``). Python takes that encoding from ``LC_CTYPE`` at
    each ``open()``, so setting it here is enough.
    """
    import codecs
    import locale

    def utf8() -> bool:
        return codecs.lookup(locale.getpreferredencoding(False)).name == "utf-8"

    for name in ("", "C.UTF-8", "C.utf8", "en_US.UTF-8"):
        if utf8():
            return
        try:
            locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            continue


def module_kind(path: str) -> str:
    """``torchscript``, ``aoti`` or ``exported``, from the file's name (see :data:`MODULE_FILES`)."""
    name = path.rsplit("/", 1)[-1]
    if name == "exported.pt2":
        return "exported"
    return "aoti" if name.endswith(".pt2") else "torchscript"


class TorchModule:
    """A TorchScript file, an AOTInductor package or a ``torch.export`` program, and the conversions
    around it (:data:`MODULE_FILES` says which file is which).

    Calling it converts floating inputs to ``compute_dtype`` and 4-D inputs to channels_last, runs
    the module and casts the outputs to ``output_dtypes``: all of it is captured into the CUDA graph
    when a :class:`BatchRunner` runs it. AOTInductor packages and exported programs were made from
    the module as it is served (FP16 channels_last on the GPU, ``builders/compiled.py``); their
    weights are already converted.

    An exported program is compiled here by ``torch.compile`` (Inductor, dynamic batch axis): one
    compile per range of batch sizes Inductor guards apart (see :meth:`warm`), run by the first
    calls (at load: a :class:`BatchRunner` on CUDA, :meth:`warm` on the CPU). Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``, by default under the temp folder)
    keeps the result, so a load on the host that built the entry, which compiled the same graph for
    its parity check, takes seconds instead of minutes. ``compile_threads`` 1 compiles in this
    process: a Triton Python stub is not a Python executable that Inductor's worker pool can start.
    """

    def __init__(
        self,
        path: str,
        device: torch.device,
        compute_dtype: torch.dtype,
        channels_last: bool,
        output_dtypes: list[torch.dtype],
        compile_threads: int = 0,
    ) -> None:
        self.device, self.compute_dtype, self.channels_last = device, compute_dtype, channels_last
        self.output_dtypes = output_dtypes
        self.kind = module_kind(path)
        self.scripted = self.kind == "torchscript"
        if self.scripted:
            module = torch.jit.load(path, map_location=device).eval()
            if compute_dtype != torch.float32:
                module = module.to(compute_dtype)
            if channels_last:
                module = module.to(memory_format=torch.channels_last)
            self.module: Any = module
        elif self.kind == "aoti":
            self.module = torch._inductor.aoti_load_package(path)
        else:
            if compile_threads:
                from torch._inductor import config as inductor_config

                inductor_config.compile_threads = compile_threads
            utf8_text_files()
            program = torch.export.load(path)
            self.module = torch.compile(program.module(), dynamic=True)

    def warm(self, inputs: Sequence[InputSpec], sizes: Sequence[int]) -> None:
        """Compile an exported program now for every batch size in ``sizes``, not in the first user
        requests (Inductor guards some ranges apart: batch 1, and on the CPU 2-15 and 16+). Only the
        CPU needs it: on CUDA a :class:`BatchRunner` runs every size at load anyway. Other kinds
        have nothing to compile."""
        if self.kind != "exported":
            return
        for n in sizes:
            # Made outside inference mode, like the tensors requests bring: Dynamo guards on the
            # difference and would compile again for them.
            zeros = [
                torch.zeros((n, *spec.shape), dtype=spec.dtype, device=self.device)
                for spec in inputs
            ]
            with torch.inference_mode():
                self(*zeros)

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        converted = []
        for x in inputs:
            if x.is_floating_point():
                x = x.to(self.compute_dtype)
            if self.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            converted.append(x)
        if self.scripted:
            # The profiling executor re-specialises the graph for every new input shape; plain
            # execution of the traced graph has no per-shape cost.
            with torch.jit.optimized_execution(False):
                result = self.module(*converted)
        else:
            result = self.module(*converted)
        if isinstance(result, torch.Tensor):
            result = (result,)
        elif isinstance(result, dict):
            result = tuple(result.values())
        if len(result) != len(self.output_dtypes):
            raise RuntimeError(
                f"the module returned {len(result)} tensors; the config declares {len(self.output_dtypes)}"
            )
        return tuple(t.to(d) for t, d in zip(result, self.output_dtypes, strict=True))


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

    def to_device(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Own copies of device outputs that outlive the next run, ready when this returns."""
        if not self.cuda:
            return list(tensors)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            owned = [t.clone() for t in tensors]
        self.stream.synchronize()
        return owned
