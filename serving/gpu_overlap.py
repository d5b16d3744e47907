"""Batches of encoded images -> model outputs on one GPU, with decode, resize and the model overlapped.

Run one after another, the steps of the GPU image pipeline (:mod:`serving.gpu_images`) add up: on an
H100 at batch 128, headers 0.77 + nvJPEG decode 5.36 + resize 2.53 + classifier 3.89 ms (issue 28).
nvJPEG blocks the calling thread until its batch is decoded (torchvision synchronises its own
stream before it returns), so in one thread nothing else is queued meanwhile. Here each step has its
own place, and batch ``n + 1`` is decoded while batch ``n`` is resized and classified:

    decode thread:  headers -> nvJPEG batch decode                       (decode stream)
    caller thread:  wait(decoded) -> resize/crop/normalise into slot s   (resize stream)
                    wait(resized) -> copy into the runner's input -> CUDA graph -> copy out to
                    pinned host memory                                   (the runner's stream)

The streams are ordered by CUDA events, never by a host synchronisation; the host waits only for
the results of batch ``n - 1`` (without the GIL) while batch ``n`` runs on the GPU and batch ``n + 1``
is decoded. Two resize slots and two pinned output slots let the resize of one batch run beside the
model of the one before. One decode thread is all that helps: torchvision decodes one batch at a
time per process (a global lock).

The GIL is what limits it (``loadtest/bench/inprocess_jpeg.py`` measures it): a thread decoding
batches of 128 with torchvision's list call does 67-159 batches/s alone on an H100 but 1-3 batches/s
beside a thread spinning in Python, so the decode call needs the GIL many times per batch. The
caller's thread here spends most of its time waiting without the GIL, which is why the overlap pays
(1.5-2.4x the serial steps in the same run, H100, batches 64-128); handing nvJPEG views made inside
TorchScript (no Python objects) did not help (11,800 against 16,200 images/s), nor did a 0.5 ms
switch interval.

The model runs in a :class:`BatchRunner` (captured CUDA graphs, static inputs); on the CPU the same
code runs with no streams, Pillow decoding in the worker thread, and the model eagerly.

Needs torch only (torchvision for nvJPEG, Pillow for the CPU and non-JPEG decode, as
``gpu_images``); importable from the source tree and beside a Triton Python model, like its
siblings.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

try:  # beside a Triton model: the copies the build placed there
    import gpu_images
    from batch_runner import BatchRunner, InputSpec
except ImportError:  # imported from the source tree
    from serving import gpu_images
    from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec

__all__ = ["BatchResult", "OverlappedPipeline", "PipelineOptions", "TopK"]

#: how long a blocked queue operation waits before it looks whether the pipeline was closed
_POLL_S = 0.05


class TopK:
    """Classifier, softmax and top-k: the forward the pipeline's CUDA graph captures for a classifier.

    Args:
        classifier: takes the ``[n, 3, size, size]`` batch and returns the logits first.
        k: classes kept per image.
    """

    def __init__(
        self, classifier: Callable[[torch.Tensor], Sequence[torch.Tensor]], k: int = 5
    ) -> None:
        self.classifier, self.k = classifier, k

    def __call__(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.classifier(pixels)[0]
        scores, ids = torch.softmax(logits.float(), dim=-1).topk(self.k, dim=-1)
        return scores, ids.to(torch.int64)


@dataclass
class BatchResult:
    """What one batch of encoded images gave.

    Attributes:
        index: the batch's position in what was submitted (results come back in that order).
        outputs: the model's outputs on the host, one row per image that decoded (``rows``).
        rows: the image (index within the batch) each output row belongs to.
        errors: per image of the batch, why it has no row (``None``: it has one).
        steps_ms: where the batch's time went: ``headers`` and ``decode`` (the decode thread's wall
            time), and with ``timing`` on, ``resize`` and ``model`` (GPU time between CUDA events).
    """

    index: int
    outputs: tuple[torch.Tensor, ...]
    rows: list[int]
    errors: list[str | None]
    steps_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class _Decoded:
    index: int
    decoded: gpu_images.DecodedImages | None = None
    ready: Any = None  # torch.cuda.Event on the decode stream (None on the CPU)
    steps_ms: dict[str, float] = field(default_factory=dict)
    failure: BaseException | None = None


@dataclass
class _InFlight:
    index: int
    slot: int
    rows: list[int]
    errors: list[str | None]
    images: list[torch.Tensor]  # kept alive until the GPU is done reading them
    outputs: tuple[torch.Tensor, ...]  # on the CPU: the outputs themselves
    steps_ms: dict[str, float]
    done: Any = None  # torch.cuda.Event after the copy to the host
    events: tuple[Any, ...] = ()  # resize start/end, model start/end (timing on)


@dataclass(frozen=True)
class PipelineOptions:
    """How an :class:`OverlappedPipeline` runs, beyond what it runs and where: one value, so the
    pipeline takes the model, the preprocessing, the device and the batch sizes, and this.

    Attributes:
        dtype: the pixels' dtype (FP16 on the GPU).
        cuda_graphs: capture the model as CUDA graphs.
        limits: the header checks' limits (default: :class:`gpu_images.DecodeLimits`' own).
        timing: record CUDA events around the resize and the model (``steps_ms``).
    """

    dtype: torch.dtype = torch.float16
    cuda_graphs: bool = True
    limits: gpu_images.DecodeLimits | None = None
    timing: bool = False


class OverlappedPipeline:
    """Encoded images -> ``forward``'s outputs, batch after batch, decode overlapping the GPU work.

    Use it as a context manager (the decode thread stops at exit) and call :meth:`map` with an
    iterable of batches, each a sequence of contiguous host ``uint8`` tensors (one encoded image
    each); it yields one :class:`BatchResult` per batch, in order. One image that cannot be read or
    decoded fails alone (its ``errors`` entry says why).

    Args:
        forward: the model on one batch of pixels (``[n, 3, size, size]``, ``options.dtype``),
            returning its output tensors (see :class:`TopK`); run by a :class:`BatchRunner`.
        p: the preprocessing (size, resize, mean, std).
        device: where to decode and run.
        batch_sizes: the batch sizes the runner prepares (ascending); the last is the largest batch.
        options: the pixels' dtype, CUDA graphs or not, the header checks' limits, timing.
    """

    def __init__(
        self,
        forward: Callable[[torch.Tensor], Sequence[torch.Tensor]],
        p: gpu_images.Preprocessing,
        device: torch.device,
        batch_sizes: Sequence[int],
        options: PipelineOptions = PipelineOptions(),
    ) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda and device.index is None:  # the decode thread sets it: name the index
            device = torch.device("cuda", torch.cuda.current_device())
        self.p, self.device = p, device
        self.limits = options.limits or gpu_images.DecodeLimits()
        self.timing = options.timing and self.cuda
        dtype = options.dtype
        self.runner = BatchRunner(
            forward,
            [InputSpec((3, p.size, p.size), dtype)],
            device,
            batch_sizes,
            cuda_graphs=options.cuda_graphs,
        )
        self.max_batch = self.runner.max_batch
        shape = (self.max_batch, 3, p.size, p.size)
        self._resized = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2)]
        self._host: list[list[torch.Tensor]] = [
            [],
            [],
        ]  # pinned output slots, made at the first batch
        if self.cuda:
            self._decode_stream = torch.cuda.Stream(device)
            self._resize_stream = torch.cuda.Stream(device)
            self._free = [
                torch.cuda.Event() for _ in range(2)
            ]  # slot s's resized pixels were copied
        self._todo: queue.Queue[tuple[int, list[torch.Tensor]] | None] = queue.Queue()
        self._decoded: queue.Queue[_Decoded] = queue.Queue(
            maxsize=2
        )  # bounds the decoded images held
        self._closed = threading.Event()
        self._worker = threading.Thread(
            target=self._decode_loop, name="gpu-overlap-decode", daemon=True
        )
        self._worker.start()
        self._mapping = False

    def __enter__(self) -> OverlappedPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the decode thread (idempotent); waits for the GPU work already queued."""
        self._closed.set()
        self._todo.put(None)
        self._worker.join()
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ the decode thread

    def _decode_loop(self) -> None:
        if self.cuda:
            torch.cuda.set_device(self.device)
        stream = torch.cuda.stream(self._decode_stream) if self.cuda else contextlib.nullcontext()
        with torch.inference_mode(), stream:
            while not self._closed.is_set():
                item = self._todo.get()
                if item is None:
                    return
                index, encoded = item
                try:
                    result = self._decode_one(index, encoded)
                except BaseException as exc:  # handed to the caller's thread, which raises it
                    result = _Decoded(index, failure=exc)
                while not self._closed.is_set():
                    try:
                        self._decoded.put(result, timeout=_POLL_S)
                        break
                    except queue.Full:
                        continue

    def _decode_one(self, index: int, encoded: list[torch.Tensor]) -> _Decoded:
        started = time.perf_counter()
        errors: list[str | None] = [None] * len(encoded)
        live, headers = [], []
        for i, data in enumerate(encoded):
            try:
                headers.append(
                    gpu_images.read_header(gpu_images.host_bytes(data), self.p, self.limits)
                )
                live.append(i)
            except (gpu_images.ImageError, ValueError) as exc:
                errors[i] = str(exc)
        read = time.perf_counter()
        decoded = gpu_images.decode([encoded[i] for i in live], headers, self.device)
        # Back to the batch's positions: one DecodedImages per batch, header errors included.
        images: list[torch.Tensor | None] = [None] * len(encoded)
        for i, image, error in zip(live, decoded.images, decoded.errors, strict=True):
            images[i], errors[i] = image, error
        ready = None
        if self.cuda:  # nvJPEG has synchronised; this also covers the CPU fallback's copies
            ready = torch.cuda.Event()
            ready.record(self._decode_stream)
        finished = time.perf_counter()
        return _Decoded(
            index,
            gpu_images.DecodedImages(images, errors),
            ready,
            {"headers": (read - started) * 1000.0, "decode": (finished - read) * 1000.0},
        )

    # ------------------------------------------------------------------ the caller's thread

    def map(self, batches: Iterable[Sequence[torch.Tensor]]) -> Generator[BatchResult, None, None]:
        """One :class:`BatchResult` per batch of ``batches``, in order (see the class docstring).

        Raises:
            ValueError: a batch is empty or larger than the largest prepared size.
            RuntimeError: :meth:`map` is already running, or the pipeline was closed.
        """
        if self._mapping or self._closed.is_set():
            raise RuntimeError("the pipeline is closed or already mapping")
        self._mapping = True
        try:
            yield from self._map(iter(batches))
        finally:
            self._mapping = False

    def _map(self, source: Iterator[Sequence[torch.Tensor]]) -> Iterator[BatchResult]:
        submitted = queued = 0

        def submit() -> None:
            nonlocal submitted
            batch = next(source, None)
            if batch is None:
                return
            if not 1 <= len(batch) <= self.max_batch:
                raise ValueError(f"a batch of {len(batch)} images is outside 1..{self.max_batch}")
            self._todo.put((submitted, list(batch)))
            submitted += 1

        pending: deque[_InFlight] = deque()
        # Two batches ahead: the decode thread starts on n + 1 as soon as it has handed n over.
        submit()
        submit()
        while queued < submitted:
            decoded = self._next_decoded()
            if decoded.failure is not None:
                raise decoded.failure
            submit()
            pending.append(self._queue_gpu(decoded))
            queued += 1
            # The host waits for batch n - 1 while the GPU runs n and the decode thread decodes n + 1.
            while len(pending) > 1:
                yield self._collect(pending.popleft())
        while pending:
            yield self._collect(pending.popleft())

    def _next_decoded(self) -> _Decoded:
        while True:
            try:
                return self._decoded.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._worker.is_alive():
                    raise RuntimeError("the decode thread stopped") from None

    def _queue_gpu(self, item: _Decoded) -> _InFlight:
        assert item.decoded is not None
        slot = item.index % 2
        rows = [i for i, image in enumerate(item.decoded.images) if image is not None]
        images = [image for image in item.decoded.images if image is not None]
        flight = _InFlight(item.index, slot, rows, item.decoded.errors, images, (), item.steps_ms)
        if not images:
            return flight
        n = len(images)
        resized = self._resized[slot][:n]
        if not self.cuda:
            with torch.inference_mode():
                gpu_images.preprocess_into(images, resized, self.p)
                flight.outputs = tuple(
                    o.clone() for o in self.runner.run(n, lambda rows: rows[0].copy_(resized))
                )
            return flight
        model_stream = self.runner.stream
        assert model_stream is not None
        events = (
            tuple(torch.cuda.Event(enable_timing=True) for _ in range(4)) if self.timing else ()
        )
        with torch.inference_mode(), torch.cuda.stream(self._resize_stream):
            self._resize_stream.wait_event(item.ready)
            self._resize_stream.wait_event(
                self._free[slot]
            )  # the model of batch n - 2 has copied this slot
            if events:
                events[0].record()
            gpu_images.preprocess_into(images, resized, self.p)
            if events:
                events[1].record()
            model_stream.wait_stream(self._resize_stream)
            if events:
                events[2].record(model_stream)
            # run() queues the copy into its static input and the graph on its own stream, after
            # what is queued on the current (resize) stream.
            outputs = self.runner.run(n, lambda rows: rows[0].copy_(resized))
        with torch.cuda.stream(model_stream):
            self._free[slot].record()
            if events:
                events[3].record()
            if not self._host[slot]:
                self._host[slot] = [
                    torch.empty((self.max_batch, *o.shape[1:]), dtype=o.dtype, pin_memory=True)
                    for o in outputs
                ]
            for host, output in zip(self._host[slot], outputs, strict=True):
                host[:n].copy_(output, non_blocking=True)
            flight.done = torch.cuda.Event()
            flight.done.record()
        flight.events = events
        return flight

    def _collect(self, flight: _InFlight) -> BatchResult:
        n = len(flight.rows)
        if flight.done is not None:
            flight.done.synchronize()  # releases the GIL: the decode thread runs meanwhile
            outputs = tuple(h[:n].clone() for h in self._host[flight.slot])
            if flight.events:
                start, resized, model_start, model_end = flight.events
                flight.steps_ms["resize"] = start.elapsed_time(resized)
                flight.steps_ms["model"] = model_start.elapsed_time(model_end)
        else:
            outputs = flight.outputs
        return BatchResult(flight.index, outputs, flight.rows, list(flight.errors), flight.steps_ms)
