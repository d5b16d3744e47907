"""A trace that pins a device: found, and refused for a CUDA entry where no GPU can re-trace it."""

from __future__ import annotations

import pytest
import torch

from builders.errors import BuildError
from builders.torchscript import TorchScriptOptions, pinned_devices, trace_for_device


class _MakesPositions(torch.nn.Module):
    # As transformers' masks do: a tensor created on the input's device is a device constant in a trace.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(x.shape[-1], device=x.device)


class _Plain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _traced(module: torch.nn.Module) -> torch.jit.ScriptModule:
    return torch.jit.trace(module, (torch.zeros(2, 3),), check_trace=False)


def test_a_trace_that_creates_tensors_on_its_input_device_pins_it() -> None:
    assert pinned_devices(_traced(_MakesPositions())) == {"cpu"}
    assert pinned_devices(_traced(_Plain())) == set()


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a GPU here re-traces on CUDA instead of refusing"
)
def test_a_cuda_entry_whose_trace_pins_the_cpu_is_refused_without_a_gpu() -> None:
    with pytest.raises(BuildError, match="pins device"):
        trace_for_device(
            _MakesPositions(), (torch.zeros(2, 3),), TorchScriptOptions(device="cuda"), "positions"
        )


def test_cpu_entries_and_device_free_graphs_keep_the_cpu_trace() -> None:
    for module, options in (
        (_MakesPositions(), TorchScriptOptions(device="cpu")),
        (_Plain(), TorchScriptOptions(gpu=True)),
    ):
        traced, args = trace_for_device(module, (torch.zeros(2, 3),), options, "entry")
        assert args[0].device.type == "cpu"  # type: ignore[attr-defined]
        assert torch.equal(traced(*args), module(*args))  # type: ignore[operator]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_entry_whose_trace_pins_the_cpu_is_traced_on_the_gpu() -> None:
    traced, args = trace_for_device(
        _MakesPositions(), (torch.zeros(2, 3),), TorchScriptOptions(device="cuda"), "positions"
    )
    assert pinned_devices(traced) == {"cuda:0"}
    assert traced(*args).device.type == "cuda"  # type: ignore[operator]
