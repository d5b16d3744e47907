"""The multimodel benchmark's GPU variants: TorchScript classifiers big enough to weigh on a card.

Each variant is an MLP of ``FEATURES -> hidden -> hidden -> CLASSES`` with random weights from
``seed + index`` (no model hub), saved as TorchScript and written as a ``pytorch_libtorch`` entry
with a KIND_GPU instance through the builders' config writer, the same path as the ONNX variants.
At the default width (4,096) the weights are about 70 MB; with the Python backend's stub and its
CUDA context a loaded variant takes a few hundred MB of GPU memory, a clear step on the meter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "GPU_HIDDEN",
    "STUB_STEPS",
    "build_torchscript_variants",
    "profile_stub_start",
    "require_cuda",
]

GPU_HIDDEN = 4096


def require_cuda() -> str:
    """The name of CUDA device 0.

    Returns:
        What ``torch.cuda.get_device_name`` says, for the report's ``device``.

    Raises:
        SystemExit: torch is missing or sees no CUDA device (``--device gpu`` cannot run here).
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the dev venv has torch
        raise SystemExit(f"--device gpu needs torch with CUDA: {exc}") from exc
    if not torch.cuda.is_available():
        raise SystemExit(
            "--device gpu needs a CUDA device, and torch sees none here "
            f"(torch {torch.__version__}); run it on the GPU host (loadtest/gpu_bench.sh)"
        )
    return str(torch.cuda.get_device_name(0))


def build_torchscript_variants(
    root: Path,
    names: Sequence[str],
    *,
    seed: int,
    features: int,
    classes: int,
    hidden: int = GPU_HIDDEN,
) -> list[str]:
    """Write a TorchScript classifier variant per name into ``root`` as KIND_GPU entries.

    Args:
        root: the model repository to write into.
        names: the variants' entry names.
        seed: weights of the ``i``-th variant come from ``seed + i``.
        features: input width.
        classes: output width.
        hidden: width of the two hidden layers.

    Returns:
        The variants' names, in order.
    """
    import torch

    from builders.spec import BatchingPolicy, TensorSpec
    from builders.triton_config import ConfigOptions, model_config, write_config

    for index, name in enumerate(names):
        generator = torch.Generator().manual_seed(seed + index)
        layers = [
            torch.nn.Linear(features, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes),
        ]
        with torch.no_grad():
            for layer in layers:
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.normal_(0.0, 0.02, generator=generator)
                    layer.bias.zero_()
        module = torch.jit.script(torch.nn.Sequential(*layers).eval())
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        torch.jit.save(module, str(root / name / "1" / "model.pt"))
        config = model_config(
            name,
            inputs=[TensorSpec("input", "float32", (features,))],
            outputs=[TensorSpec("logits", "float32", (classes,))],
            batching=BatchingPolicy(max_batch_size=8, max_queue_delay_us=100, instance_count=1),
            options=ConfigOptions(platform="pytorch_libtorch", gpu=True, warmup=False),
        )
        write_config(config, root / name / "config.pbtxt")
    return list(names)


# Run in a fresh interpreter, as a stub starts: the steps of serving/backends/pytorch/model.py's load
# for one variant, each timed after the GPU finished it.
STUB_STEPS = """
import json, sys, time
marks = [("start", time.perf_counter())]
import torch
marks.append(("import torch", time.perf_counter()))
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
torch.zeros(1, device=device)
torch.cuda.synchronize()
marks.append(("CUDA context", time.perf_counter()))
from serving.backends.pytorch.batch_runner import BatchRunner, InputSpec, capture_sizes
from serving.backends.pytorch.torch_module import TorchModule
marks.append(("serving imports", time.perf_counter()))
module = TorchModule(sys.argv[1], device, torch.float16, False, [torch.float32], compile_threads=1)
torch.cuda.synchronize()
marks.append(("TorchScript load + to GPU", time.perf_counter()))
specs = [InputSpec((int(sys.argv[2]),), torch.float32)]
runner = BatchRunner(module, specs, device, capture_sizes(int(sys.argv[3])), cuda_graphs=True)
torch.cuda.synchronize()
marks.append(("CUDA graph capture", time.perf_counter()))
print(json.dumps({b[0]: round(b[1] - a[1], 4) for a, b in zip(marks, marks[1:])}))
"""


def profile_stub_start(entry: Path, features: int, max_batch: int = 8) -> dict[str, float]:
    """Seconds each step of a variant's stub start takes, measured in a fresh interpreter.

    The Python backend starts one stub process per model instance; a cold load pays these steps
    (and Triton's own part: the stub's launch and shared-memory handshake) every time.

    Args:
        entry: the variant's repository entry (``<entry>/1/model.pt``).
        features: the input width.
        max_batch: the entry's ``max_batch_size`` (the sizes captured at load follow from it).

    Returns:
        Step name -> seconds, in order, plus ``"process"``: the child's whole wall time.
    """
    import json
    import subprocess
    import sys
    import time

    started = time.perf_counter()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            STUB_STEPS,
            str(entry / "1" / "model.pt"),
            str(features),
            str(max_batch),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    steps: dict[str, float] = json.loads(child.stdout.strip().splitlines()[-1])
    steps["process"] = round(time.perf_counter() - started, 4)
    return steps
