"""Triton Python model: encoded images -> top-k ImageNet classes, every step on the GPU, one process.

    IMAGE (uint8 bytes of one JPEG/PNG/... per row) -> header checks -> nvJPEG batch decode
        -> resize / crop / normalise (one batch, FP16) -> classifier (CUDA graph, channels_last)
        -> softmax + top-k -> SCORES, CLASS_IDS (and LABELS, where strings can be sent)

Why one model and not an ensemble of three Python models: each Python model is its own process, so
an ensemble hands tensors across processes (CUDA IPC) and puts three CUDA contexts on one GPU,
which time-slice rather than overlap (the prototype saw two processes on one GPU collapse to 205
images/s). Here the decoded batch never leaves the GPU and the classifier plus the top-k run as one
captured graph per batch size.

The input is ``UINT8 [-1]`` with ragged batching, not ``BYTES``: the embedded Triton 2.51 Python stub
cannot exchange strings under numpy 2 (a BYTES input kills the stub; string outputs arrive empty),
while numeric tensors cross by DLPack under numpy 1 and 2. A request row holds one encoded image;
a request of several rows pads them to one length with zeros (decoders ignore bytes after the image).
``LABELS`` (BYTES) is produced only when asked for and only where the stub's numpy interop works
(numpy 1, or a Triton whose stub supports numpy 2); elsewhere asking for it fails with a message
that says so, and ``CLASS_IDS`` index the ``labels.txt`` shipped in the version folder.

By default an ``execute()`` runs its whole batch through each step once: one nvJPEG batch decode,
one resize pass, one classifier graph, one copy back; the host waits for the GPU once. With
``pipeline_chunk`` N > 0 the batch is cut into chunks of N images that overlap instead (nvJPEG
decodes chunk k+1 while the resize and the graph of chunk k run on the runner's stream; the graphs
are then captured only up to N). The whole batch beat the overlap on the H200 (``benchmarks/h200``,
run 5, call 2): in process at batch 64, steps back to back 7,446 images/s against 7,065 in chunks of 32
(TorchScript classifier) and 9,045 against 8,342 (compiled classifier); served with the compiled
classifier at concurrency 64 and 128, 5,284 and 6,877 images/s whole against 5,114 and 6,048 in
chunks (2,849 against 2,998 at 32).

With ``overlap`` on, ``execute()`` only copies the batch's bytes and hands them to a
``StreamingPipeline`` (``gpu_stream.py``) and returns; the responses are sent from the pipeline's
thread (``image_stream_execute.py``). Triton batch n + 1 is then decoded while batch n is resized and
classified, across ``execute()`` calls: the overlap of the in-process pipeline (``gpu_overlap.py``).

The classifier is another entry of the same repository (parameter ``classifier``), a TorchScript
``model.pt``, or a compiled flavour's ``exported.pt2`` or ``model.pt2`` (``builders/compiled.py``); its
newest version is loaded. Parameters: ``size``, ``resize``, ``mean``, ``std`` (the CPU pipeline's),
``top_k``, ``precision``, ``channels_last``,
``cuda_graphs``, ``batch_sizes`` (as the pytorch backend), ``pipeline_chunk`` (images per chunk;
0, the default: the whole batch at once), ``overlap`` (``true``: the overlapped way above; then
``pipeline_chunk`` does not apply) and ``overlap_depth`` (batches taken before ``execute()`` waits;
2: one decoded while the one before is on the GPU), ``overlap_send_threads`` (responses sent at
once, 8) and ``overlap_stall_s`` (a batch unanswered this long fails every waiting request and the
pipeline takes no more, so the gateway's healer reloads the model; 30).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils
from batch_runner import BatchRunner, InputSpec, capture_sizes
from gpu_images import (
    DecodeLimits,
    ImageError,
    ImageHeader,
    Preprocessing,
    decode_chunks,
    host_bytes,
    preprocess_into,
    read_header,
)
from gpu_overlap import PipelineOptions, TopK
from gpu_stream import DEFAULT_STALL_S, StreamingPipeline
from image_answers import Answers
from image_stream_execute import StreamedExecute
from step_metrics import StepTimes
from torch_module import MODULE_FILES, TorchModule, cpu_share


def _floats(raw: str) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in raw.split(","))
    return a, b, c


def _classifier_file(repository: str, name: str) -> str:
    entry = os.path.join(repository, name)
    versions = sorted(int(v) for v in os.listdir(entry) if v.isdigit())
    if not versions:
        raise pb_utils.TritonModelException(
            f"classifier entry {name!r} has no version in {repository}"
        )
    folder = os.path.join(entry, str(versions[-1]))
    for filename in MODULE_FILES:
        if os.path.exists(os.path.join(folder, filename)):
            return os.path.join(folder, filename)
    raise pb_utils.TritonModelException(
        f"classifier entry {name!r} has none of {', '.join(MODULE_FILES)}"
    )


def _strings_work() -> bool:
    """Whether this stub exchanges numpy arrays correctly (it does not under numpy 2 in Triton 2.51)."""
    probe = pb_utils.Tensor.from_dlpack(
        "probe", torch.utils.dlpack.to_dlpack(torch.arange(4, dtype=torch.float32))
    )
    try:
        return [float(v) for v in probe.as_numpy().reshape(-1)] == [0.0, 1.0, 2.0, 3.0]
    except Exception:
        return False


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.p = Preprocessing(
            int(params.get("size", 224)),
            int(params.get("resize", 256)),
            _floats(params.get("mean", "0.5,0.5,0.5")),
            _floats(params.get("std", "0.5,0.5,0.5")),
        )
        self.k = int(params.get("top_k", 5))
        self.limits = DecodeLimits(
            int(params.get("max_source_pixels", DecodeLimits.max_source_pixels)),
            float(params.get("max_aspect_ratio", DecodeLimits.max_aspect_ratio)),
            int(params.get("max_resized_pixels", DecodeLimits.max_resized_pixels)),
        )
        gpu_kind = args.get("model_instance_kind", "CPU").upper() == "GPU"
        use_cuda = torch.cuda.is_available() and (
            gpu_kind or params.get("device", "auto") == "cuda"
        )
        self.device = (
            torch.device("cuda", int(args.get("model_instance_device_id", "0") or 0))
            if use_cuda
            else torch.device("cpu")
        )
        if use_cuda:
            torch.cuda.set_device(self.device)
            # The host only parses headers and queues GPU work: ATen's OpenMP threads would only add
            # barriers waiting for descheduled threads on a busy host (see batch_runner.py).
            torch.set_num_threads(1)
        else:  # this instance's share of the cores, not every core (see cpu_share)
            torch.set_num_threads(cpu_share(config))
        dtype = (
            torch.float16
            if use_cuda and params.get("precision", "fp16") == "fp16"
            else torch.float32
        )
        repository = os.path.dirname(os.path.normpath(args["model_repository"]))
        classifier = TorchModule(
            _classifier_file(repository, params["classifier"]),
            self.device,
            dtype,
            use_cuda and params.get("channels_last", "true") == "true",
            [torch.float32],
            compile_threads=1,
        )
        self.max_batch = int(config["max_batch_size"])
        overlap = params.get("overlap", "false") == "true"
        # One run takes at most a chunk: the graphs only need to go that far. The overlapped way
        # runs whole batches (it overlaps Triton's batches instead of chunks of one).
        chunk = 0 if overlap else int(params.get("pipeline_chunk", "0"))
        self.chunk = min(chunk, self.max_batch) if chunk > 0 and use_cuda else self.max_batch
        listed = [int(s) for s in params.get("batch_sizes", "").split(",") if s.strip()]
        sizes = capture_sizes(self.chunk, sizes=listed) if listed else capture_sizes(self.chunk)
        pixels = [InputSpec((3, self.p.size, self.p.size), dtype)]
        graphs = use_cuda and params.get("cuda_graphs", "true") == "true"
        # The CPU runs exact batches: a compiled classifier compiles for all of them now.
        if not use_cuda:
            classifier.warm(pixels, sizes)
        with open(
            os.path.join(args["model_repository"], args["model_version"], "labels.txt"),
            encoding="utf-8",
        ) as handle:
            # Class names ship with underscores (tiger_cat); users read "tiger cat".
            labels = [line.strip().replace("_", " ") for line in handle if line.strip()]
        self.answers = Answers(pb_utils, labels, _strings_work())
        # Where execute()'s time goes, on Triton's /metrics page (see step_metrics.py).
        self.steps = StepTimes(
            pb_utils,
            args["model_name"],
            args["model_version"],
            ("inputs", "decode", "queue_gpu", "wait_gpu", "respond"),
        )
        self.streamed: StreamedExecute | None = None
        if overlap:
            pipeline = StreamingPipeline(
                TopK(classifier, self.k),
                self.p,
                self.device,
                sizes if use_cuda else (self.max_batch,),
                PipelineOptions(dtype=dtype, cuda_graphs=graphs, limits=self.limits),
                depth=int(params.get("overlap_depth", "2")),
                stall_s=float(params.get("overlap_stall_s", DEFAULT_STALL_S)),
            )
            pipeline.warm_up()  # ready means fast: the first requests do not pay the lazy start
            self.streamed = StreamedExecute(
                pipeline,
                self._rows,
                self.answers,
                self.steps,
                pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                send_threads=int(params.get("overlap_send_threads", "8")),
            )
            return
        self.runner = BatchRunner(
            TopK(classifier, self.k),
            pixels,
            self.device,
            sizes if use_cuda else (self.chunk,),
            cuda_graphs=graphs,
        )

    def _rows(self, request: Any) -> torch.Tensor:
        """The request's ``IMAGE`` as ``[images, bytes]`` uint8 on the host, or ``ImageError``."""
        tensor = pb_utils.get_input_tensor_by_name(request, "IMAGE")
        if tensor is None:
            raise ImageError("missing input 'IMAGE'")
        if not tensor.is_cpu():
            raise ImageError(
                "IMAGE must be sent in host memory (HTTP, gRPC or system shared memory)"
            )
        rows = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
            raise ImageError(
                f"IMAGE must be UINT8 [images, bytes] holding encoded images; got {rows.dtype} "
                f"{list(rows.shape)}"
            )
        return rows

    def _images(self, request: Any) -> tuple[list[torch.Tensor], list[ImageHeader]]:
        rows = self._rows(request)
        encoded = [rows[r] for r in range(rows.shape[0])]
        return encoded, [read_header(host_bytes(e), self.p, self.limits) for e in encoded]

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.streamed is not None:  # answered from the pipeline's thread
            return self.streamed(requests)
        responses: list[Any] = [None] * len(requests)
        with self.steps.step("inputs"):
            owners, encoded, headers = self._gather(requests, responses)
        rows, chunks = self._queue(
            encoded, headers, owners, responses
        )  # times "decode" and "queue_gpu"
        with self.steps.step("wait_gpu"):
            self.runner.synchronize()
        with self.steps.step("respond"):
            self._answer(requests, responses, owners, rows, chunks)
        self.steps.executed(len(encoded))
        return responses

    def _gather(
        self, requests: list[Any], responses: list[Any]
    ) -> tuple[list[int], list[torch.Tensor], list[ImageHeader]]:
        """Every request's images and headers; a request with a bad input gets its error response."""
        owners: list[int] = []  # request index of each image
        encoded: list[torch.Tensor] = []
        headers: list[ImageHeader] = []
        for index, request in enumerate(requests):
            try:
                images, found = self._images(request)
            except ImageError as exc:
                responses[index] = self.answers.error(str(exc))
                continue
            owners += [index] * len(images)
            encoded += images
            headers += found
        return owners, encoded, headers

    def _queue(
        self,
        encoded: list[torch.Tensor],
        headers: list[ImageHeader],
        owners: list[int],
        responses: list[Any],
    ) -> tuple[list[int], list[tuple[list[torch.Tensor], list[torch.Tensor]]]]:
        """Decode each chunk and queue its GPU work: the image index of each output row, and per chunk
        (decoded images, host outputs not yet waited for)."""
        rows: list[int] = []
        chunks: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        # Each chunk's decode blocks the host while the GPU still runs the chunk before.
        decoding = decode_chunks(
            encoded, headers, self.device, self.chunk, lambda i: responses[owners[i]] is not None
        )
        while True:
            with self.steps.step("decode"):
                chunk = next(decoding, None)
            if chunk is None:
                return rows, chunks
            live, decoded = chunk
            with self.steps.step("queue_gpu"):
                for i, error in zip(live, decoded.errors, strict=True):
                    if error is not None and responses[owners[i]] is None:
                        responses[owners[i]] = self.answers.error(error)
                kept = [
                    (i, image)
                    for i, image in zip(live, decoded.images, strict=True)
                    if image is not None and responses[owners[i]] is None
                ]
                if not kept:
                    continue
                images = [image for _, image in kept]
                outputs = self.runner.run(
                    len(images),
                    lambda batch, images=images: preprocess_into(images, batch[0], self.p),
                )  # type: ignore[misc]
                # The decoded images stay referenced until the stream is done with them (they were
                # allocated on another stream; freed earlier, their memory could be handed out again).
                chunks.append((images, self.runner.to_host(outputs, wait=False)))
                rows += [i for i, _ in kept]

    def _answer(
        self,
        requests: list[Any],
        responses: list[Any],
        owners: list[int],
        rows: list[int],
        chunks: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
    ) -> None:
        """Responses from the host outputs (the stream has been waited for)."""
        if not chunks:
            return
        scores, ids = (
            torch.cat([c[1][j] for c in chunks]) if len(chunks) > 1 else chunks[0][1][j]
            for j in range(2)
        )
        # A request fails whole: drop the rows of one whose later image failed after its first ran.
        good = [r for r, i in enumerate(rows) if responses[owners[i]] is None]
        if len(good) < len(rows):
            keep = torch.tensor(good, dtype=torch.long)
            scores, ids = scores.index_select(0, keep), ids.index_select(0, keep)
        if good:
            self.answers.rows(
                responses,
                [owners[rows[r]] for r in good],
                scores,
                ids,
                lambda owner: "LABELS" in requests[owner].requested_output_names(),
            )

    def finalize(self) -> None:
        if self.streamed is not None:  # answers what it took before the process goes
            self.streamed.close()
        self.steps.flush()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
