"""The overlapped image pipeline: the same top-5 as the steps run one after another, bad images alone.

Unit tests on a small seeded classifier (no Triton). On the CPU the pipeline runs its decode thread
with Pillow and the model eagerly; the ``gpu`` tests run nvJPEG,
streams and CUDA graphs, and are skipped where there is no GPU.
"""

from __future__ import annotations

import pytest
import torch

from loadtest.payloads import jpeg_images
from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec
from serving.gpu_images import Preprocessing, decode, host_bytes, preprocess_into, read_header
from serving.gpu_overlap import BatchResult, OverlappedPipeline, PipelineOptions, TopK

P = Preprocessing()
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False)",
)


class _Tiny(torch.nn.Module):
    """Seeded conv + linear over 16 classes: cheap, and its top-5 moves with the pixels."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 5, stride=4)
        self.head = torch.nn.Linear(8 * 4 * 4, 16)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        features = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 4)
        return (self.head(features.flatten(1)),)


def _encoded(data: list[bytes]) -> list[torch.Tensor]:
    return [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]


def _serial(
    model: TopK, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-5 of every sample photo with the steps one after another, the whole set as one batch."""
    encoded = _encoded(list(jpeg_images()))
    images = decode(encoded, [read_header(host_bytes(e), P) for e in encoded], device).images
    runner = BatchRunner(model, [InputSpec((3, P.size, P.size), dtype)], device, (len(encoded),))
    with torch.inference_mode():
        scores, ids = runner.to_host(
            runner.run(len(images), lambda rows: preprocess_into(images, rows[0], P))
        )  # type: ignore[arg-type]
    return scores.clone(), ids.clone()


def _overlapped(
    model: TopK, device: torch.device, dtype: torch.dtype, batch: int
) -> list[BatchResult]:
    encoded = _encoded(list(jpeg_images()))
    batches = [encoded[i : i + batch] for i in range(0, len(encoded), batch)]
    with OverlappedPipeline(model, P, device, (batch,), PipelineOptions(dtype=dtype)) as pipeline:
        return list(pipeline.map(batches))


def _check_same_top5(
    results: list[BatchResult], scores: torch.Tensor, ids: torch.Tensor, tolerance: float
) -> None:
    assert [r.index for r in results] == list(range(len(results)))
    assert all(e is None for r in results for e in r.errors)
    got_scores = torch.cat([r.outputs[0] for r in results])
    got_ids = torch.cat([r.outputs[1] for r in results])
    assert got_ids.shape == ids.shape == (len(jpeg_images()), 5)
    assert torch.equal(got_ids, ids), (got_ids, ids)
    assert torch.allclose(got_scores, scores, atol=tolerance), (got_scores - scores).abs().max()


def test_cpu_same_top5_as_the_serial_path() -> None:
    model = TopK(_Tiny().eval())
    scores, ids = _serial(model, torch.device("cpu"), torch.float32)
    # Batches of 5 over the 22 photos: the last batch is short, and batches alternate the two slots.
    _check_same_top5(_overlapped(model, torch.device("cpu"), torch.float32, 5), scores, ids, 1e-5)


def test_bad_images_fail_alone() -> None:
    good = list(jpeg_images()[:3])
    bad = b"this is not an image"
    encoded = _encoded([good[0], bad, good[1], good[2][: len(good[2]) // 4]])
    model = TopK(_Tiny().eval())
    with OverlappedPipeline(
        model, P, torch.device("cpu"), (4,), PipelineOptions(dtype=torch.float32)
    ) as pipeline:
        first, only_bad = pipeline.map([encoded, [encoded[1]]])
    assert first.errors[1] is not None and "not a decodable image" in first.errors[1]
    assert first.errors[0] is None and first.errors[2] is None
    # A truncated JPEG either decodes as far as it goes or fails alone (decoders differ).
    assert first.rows == [i for i, e in enumerate(first.errors) if e is None]
    assert first.outputs[0].shape == (len(first.rows), 5)
    assert only_bad.rows == [] and only_bad.outputs == () and only_bad.errors[0] is not None


def test_stopping_early_leaves_no_thread_behind() -> None:
    encoded = _encoded(list(jpeg_images()[:2]))
    pipeline = OverlappedPipeline(
        TopK(_Tiny().eval()), P, torch.device("cpu"), (2,), PipelineOptions(dtype=torch.float32)
    )
    results = pipeline.map([encoded] * 10)
    assert next(results).index == 0
    results.close()
    pipeline.close()
    assert not pipeline._worker.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(pipeline.map([encoded])))


def test_a_batch_larger_than_prepared_is_refused() -> None:
    encoded = _encoded(list(jpeg_images()[:3]))
    with OverlappedPipeline(
        TopK(_Tiny().eval()), P, torch.device("cpu"), (2,), PipelineOptions(dtype=torch.float32)
    ) as pipeline:
        with pytest.raises(ValueError, match="outside 1..2"):
            list(pipeline.map([encoded]))


@pytest.mark.gpu
@needs_cuda
def test_gpu_same_top5_as_the_serial_path() -> None:
    device = torch.device("cuda")
    model = TopK(_Tiny().to(device).half().eval())
    scores, ids = _serial(model, device, torch.float16)
    results = _overlapped(model, device, torch.float16, 8)
    _check_same_top5(results, scores, ids, 1e-3)


@pytest.mark.gpu
@needs_cuda
def test_gpu_bad_files_fail_alone() -> None:
    device = torch.device("cuda")
    good = list(jpeg_images()[:3])
    encoded = _encoded(
        [
            good[0],
            good[1][: len(good[1]) // 3] + b"\x00" * 16,
            b"\xff\xd8\xff\xe0\x00\x02" + b"\x00" * 64,
            good[2],
        ]
    )
    with OverlappedPipeline(TopK(_Tiny().to(device).half().eval()), P, device, (4,)) as pipeline:
        (result,) = pipeline.map([encoded])
    assert result.errors[0] is None and result.errors[3] is None and result.errors[2] is not None
    assert 0 in result.rows and 3 in result.rows and 2 not in result.rows
