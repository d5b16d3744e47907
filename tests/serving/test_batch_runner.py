"""The GPU batch runner: padded sizes, one batch from host and device parts, CUDA graphs equal eager.

Unit tests on a small convolutional module (no Triton). The CPU tests run everywhere; the ``gpu``
tests need CUDA and are skipped with the reason where there is none.
"""

from __future__ import annotations

import pytest
import torch

from serving.backends.pytorch.batch_runner import (
    BatchRunner,
    InputSpec,
    capture_sizes,
    host_cat,
    host_copy,
)

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False)"
)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.head(torch.relu(self.conv(x)).mean(dim=(2, 3))),)


def _runner(
    device: str, graphs: bool, sizes: tuple[int, ...] = (1, 2, 4, 8)
) -> tuple[BatchRunner, _Net]:
    net = _Net().to(device).eval()
    return BatchRunner(
        net, [InputSpec((3, 8, 8), torch.float32)], torch.device(device), sizes, cuda_graphs=graphs
    ), net


def test_capture_sizes_cover_every_batch_up_to_the_maximum() -> None:
    sizes = capture_sizes(100, preferred=(50,))
    assert sizes[-1] == 100 and 50 in sizes and sizes == tuple(sorted(set(sizes)))
    assert capture_sizes(1) == (1,)
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_bucket_is_the_smallest_prepared_size() -> None:
    runner, _ = _runner("cpu", graphs=False, sizes=(1, 2, 4, 8))
    assert [runner.bucket(n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    for n in (0, 9):
        with pytest.raises(ValueError):
            runner.bucket(n)


def test_cpu_run_parts_concatenates_requests() -> None:
    runner, net = _runner("cpu", graphs=False)
    parts = [[torch.randn(k, 3, 8, 8)] for k in (1, 3, 2)]
    (out,) = runner.run_parts(parts)
    with torch.inference_mode():
        (expected,) = net(torch.cat([p[0] for p in parts]))
    torch.testing.assert_close(out, expected)


def test_host_cat_and_copy_equal_torch_for_every_layout() -> None:
    parts = [torch.randn(k, 3, 4, 4) for k in (1, 3, 2)]
    merged = host_cat(parts)
    torch.testing.assert_close(merged, torch.cat(parts), rtol=0, atol=0)
    assert host_cat(parts[:1]) is parts[0]  # one request: no copy at all
    transposed = torch.randn(4, 4, 3).permute(2, 0, 1)  # not contiguous: the copy_ fallback
    dst = torch.empty(3, 4, 4)
    host_copy(dst, transposed)
    torch.testing.assert_close(dst, transposed, rtol=0, atol=0)
    halves = torch.empty(2, 3, dtype=torch.float16)
    host_copy(halves, torch.ones(2, 3))  # dtypes differ: converted by copy_, not reinterpreted
    assert halves.dtype == torch.float16 and bool((halves == 1).all())
    host_copy(torch.empty(0, 3), torch.empty(0, 3))  # nothing to move


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("graphs", [True, False])
def test_gpu_host_and_device_parts_padded_batches_equal_eager(graphs: bool) -> None:
    runner, net = _runner("cuda", graphs=graphs)
    for sizes in (
        (1,),
        (2, 1),
        (3, 2, 1),
        (1, 1, 1, 1, 1),
    ):  # 1, 3 (padded to 4), 6 (to 8), 5 (to 8)
        parts = [[torch.randn(k, 3, 8, 8)] for k in sizes]
        parts[0] = [parts[0][0].cuda()]  # one request arrived in GPU memory (CUDA shared memory)
        (out,) = runner.to_host(runner.run_parts(parts))
        with torch.inference_mode():
            (expected,) = net(torch.cat([p[0].cuda() for p in parts]))
        assert out.shape == (sum(sizes), 5) and not out.is_cuda
        torch.testing.assert_close(out, expected.cpu(), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@needs_cuda
def test_gpu_outputs_kept_on_the_device_outlive_the_next_run() -> None:
    runner, net = _runner("cuda", graphs=True)
    first_in = torch.randn(2, 3, 8, 8)
    (first,) = runner.to_device(runner.run_parts([[first_in]]))
    runner.run_parts([[torch.randn(2, 3, 8, 8)]])  # overwrites the graph's static output
    with torch.inference_mode():
        (expected,) = net(first_in.cuda())
    assert first.is_cuda
    torch.testing.assert_close(first, expected, rtol=1e-3, atol=1e-3)
