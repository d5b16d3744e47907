"""Load the module a ``pytorch`` entry serves, and the process settings its instance needs.

:class:`TorchModule` is a TorchScript file, an AOTInductor package or a ``torch.export`` program
(:data:`MODULE_FILES`) with the dtype and memory-format conversions around it; a
:class:`~batch_runner.BatchRunner` runs it on whole batches. :func:`cpu_share` and
:func:`utf8_text_files` set up the Python stub's process for it.

Only torch is imported (see ``batch_runner.py`` for why no numpy, no Triton). The pytorch backend
imports this file as a sibling module (Triton puts a Python-based backend's folder on ``sys.path``);
the builders copy it, with ``batch_runner.py``, beside GPU pipeline models.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from serving.backends.pytorch.batch_runner import InputSpec

__all__ = ["MODULE_FILES", "TorchModule", "cpu_share", "module_kind", "utf8_text_files"]

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
    calls (at load: a :class:`BatchRunner` on CUDA, :meth:`warm` on the CPU). Inductor's cache
    (``TORCHINDUCTOR_CACHE_DIR``, by default under the temp folder) keeps the result, so a load on
    the host that built the entry, which compiled the same graph for its parity check, takes seconds
    instead of minutes. ``compile_threads`` 1 compiles in this process: a Triton Python stub is not
    a Python executable that Inductor's worker pool can start.
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
