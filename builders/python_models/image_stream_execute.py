"""``image_classifier_gpu``'s overlapped way: ``execute()`` hands its batch on and returns at once.

Triton calls a model instance's ``execute()`` with the next batch only once the last call has
returned, so while ``execute()`` runs its batch from decode to response (the default way), the next
batch's decode cannot overlap this batch's GPU work. Since Triton 24.06 a model that is not
decoupled may answer through each request's response sender and return ``None`` (exactly one final
response per request). Here ``execute()`` copies each request's bytes (Triton frees a request's
tensors when ``execute()`` returns), keeps its response sender, submits the batch to a
:class:`StreamingPipeline` and returns; the pipeline's thread sends the responses. Triton batch
``n + 1`` is then decoded while batch ``n`` is on the GPU (``serving/gpu_stream.py``).

A response sender's ``send()`` is a round trip to the Triton process (it waits, without the GIL,
until one of the backend's threads has taken the response): about 0.2 ms a request on an H100 host,
against a few microseconds a request for responses returned from ``execute()``. Sent one after
another from the pipeline's thread, they were the bound of the whole path (``benchmarks/h100``, run 9).
So the sends go to a small pool of threads and overlap one another; the backend serves them with a
pool of its own (32 threads by default).

Shipped beside the model in its version folder (the stub imports it by file name).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from gpu_images import ImageError
from gpu_overlap import BatchResult
from gpu_stream import StreamingPipeline
from image_answers import Answers
from step_metrics import StepTimes

__all__ = ["StreamedExecute"]

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """One ``execute()``'s requests, as the pipeline's thread answers them."""

    senders: list[Any] = field(default_factory=list)
    wants_labels: list[bool] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)  # the request (sender index) of each image
    encoded: list[torch.Tensor] = field(default_factory=list)


class StreamedExecute:
    """``execute()`` for the overlapped way.

    Args:
        pipeline: runs the batches.
        rows: a request's ``IMAGE`` rows (``[images, bytes]`` uint8 on the host), or ``ImageError``.
        answers: builds the responses.
        steps: where the time goes (``inputs`` here, the rest in the pipeline's threads).
        final: the stub's ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` flag.
        send_threads: responses in flight to the Triton process at once.
    """

    def __init__(
        self,
        pipeline: StreamingPipeline,
        rows: Callable[[Any], torch.Tensor],
        answers: Answers,
        steps: StepTimes,
        final: int,
        send_threads: int = 8,
    ) -> None:
        self.pipeline, self.rows, self.answers, self.steps = pipeline, rows, answers, steps
        self.final = final
        self._senders = ThreadPoolExecutor(send_threads, thread_name_prefix="respond")

    def close(self) -> None:
        """Answer what was taken, then stop the pipeline and the sending threads."""
        self.pipeline.close()
        self._senders.shutdown(wait=True)

    def _send(self, sender: Any, response: Any) -> None:
        try:
            sender.send(response, flags=self.final)
        except Exception:  # the client may be gone; the others are still answered
            log.exception("sending a response failed")

    def __call__(self, requests: list[Any]) -> None:
        batch = _Batch()
        with self.steps.step("inputs"):
            for request in requests:
                sender = request.get_response_sender()
                try:
                    rows = self.rows(request)
                    wants_labels = "LABELS" in request.requested_output_names()
                    # The request's own tensor is freed when execute() returns.
                    copied = rows.clone()
                except ImageError as exc:
                    sender.send(self.answers.error(str(exc)), flags=self.final)
                    continue
                except Exception as exc:  # this request fails alone; it still gets its one answer
                    message = f"reading the request failed: {exc}"
                    sender.send(self.answers.failure(message), flags=self.final)
                    continue
                owner = len(batch.senders)
                batch.senders.append(sender)
                batch.wants_labels.append(wants_labels)
                batch.encoded += [copied[r] for r in range(copied.shape[0])]
                batch.owners += [owner] * copied.shape[0]
        try:
            if batch.encoded:
                self.pipeline.submit(batch.encoded, functools.partial(self._answer, batch))
                batch = _Batch()  # taken: the pipeline answers it from here on
            # Triton forms the next batch when this returns: not before the pipeline has room.
            self.pipeline.wait_for_room()
        except Exception as exc:  # every request this call took must still get its one answer
            self._fail(batch.senders, f"the batch failed: {exc}")
        return None

    def _fail(self, senders: list[Any], message: str) -> None:
        for sender in senders:
            self._senders.submit(self._send, sender, self.answers.failure(message))

    def _answer(self, batch: _Batch, result: BatchResult | BaseException) -> None:
        """Called from the pipeline's thread once the batch's outputs are on the host."""
        if isinstance(result, BaseException):
            self._fail(batch.senders, f"the batch failed: {result}")
            return
        for step in ("decode", "queue_gpu", "wait_gpu"):
            self.steps.add(step, result.steps_ms.get(step, 0.0) / 1000.0)
        self.steps.add("decode", result.steps_ms.get("headers", 0.0) / 1000.0)
        with self.steps.step("respond"):
            try:
                responses = self._responses(batch, result)
            except Exception as exc:  # every request of the batch must still get its one answer
                self._fail(batch.senders, f"answering the batch failed: {exc}")
                return
            for sender, response in zip(batch.senders, responses, strict=True):
                answer = response or self.answers.failure("no answer was made")
                self._senders.submit(self._send, sender, answer)
        self.steps.executed(len(batch.encoded))

    def _responses(self, batch: _Batch, result: BatchResult) -> list[Any]:
        """One response per request of ``batch`` (``None`` where none was made)."""
        responses: list[Any] = [None] * len(batch.senders)
        # A request fails whole: one bad image fails the images it came with.
        for image, error in enumerate(result.errors):
            if error is not None and responses[batch.owners[image]] is None:
                responses[batch.owners[image]] = self.answers.error(error)
        good = [r for r, i in enumerate(result.rows) if responses[batch.owners[i]] is None]
        if good:
            scores, ids = result.outputs
            if len(good) < len(result.rows):
                keep = torch.tensor(good, dtype=torch.long)
                scores, ids = scores.index_select(0, keep), ids.index_select(0, keep)
            owners = [batch.owners[result.rows[r]] for r in good]
            self.answers.rows(
                responses, owners, scores, ids, lambda owner: batch.wants_labels[owner]
            )
        return responses
