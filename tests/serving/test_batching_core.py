"""The batching core of the Python-based backends, through the real Triton binary.

Two tiny models that look a value up in a table of four, one per backend: ``gather_onnx``
(``onnxruntime_onnx``: an ONNX ``Gather``) and ``gather_torch`` (``pytorch_libtorch``: a TorchScript
index). An index outside the table makes the runtime raise, so a request carrying one cannot run;
inputs of any length batch together only when their lengths match. Both models wait for four
requests before running a batch, so the requests of a test share one execution.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import tritonclient.http as http
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from builders.triton_config import write_config
from serving.launcher import TritonPorts, TritonServer
from tests.support.triton_stats import counts, wait_for_counts

pytestmark = pytest.mark.integration

TABLE = np.array([10.0, 20.0, 30.0, 40.0], dtype=np.float32)
#: rows per batch: the models wait (up to 5 s) for this many before running
BATCH = 4
#: (model, input, output) per backend
MODELS = {
    "onnxruntime": ("gather_onnx", "IDX", "OUT"),
    "pytorch": ("gather_torch", "INPUT__0", "OUTPUT__0"),
}
#: the same models with a ragged input (``allow_ragged_batch``), grouped by length edges (onnxruntime) or
#: by the cheapest split (pytorch)
RAGGED = {backend: (f"{model}_ragged", inp, out) for backend, (model, inp, out) in MODELS.items()}
#: what a runtime says about an index out of range; none of it may reach the client
LEAKS = ("out of bounds", "out of data bounds", "Gather", "index", "Traceback", ".py", "/")


class _Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.from_numpy(TABLE))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table[idx]


def _config(name: str, platform: str, inp: str, out: str, filename: str) -> mc.ModelConfig:
    config = mc.ModelConfig(
        name=name, platform=platform, max_batch_size=8, default_model_filename=filename
    )
    config.input.add(name=inp, data_type=mc.TYPE_INT64, dims=[-1])
    config.output.add(name=out, data_type=mc.TYPE_FP32, dims=[-1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.dynamic_batching.preferred_batch_size.append(BATCH)
    # Long enough that the four requests of a test always meet in one batch, even on a busy machine.
    config.dynamic_batching.max_queue_delay_microseconds = 5_000_000
    return config


def _write_repository(root: Path) -> Path:
    name, inp, out = MODELS["onnxruntime"]
    (root / name / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["TABLE", inp], [out], axis=0)],
        name,
        [helper.make_tensor_value_info(inp, TensorProto.INT64, ["N", "L"])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", "L"])],
        initializer=[numpy_helper.from_array(TABLE, "TABLE")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(root / name / "1" / "model.onnx"))
    write_config(
        _config(name, "onnxruntime_onnx", inp, out, "model.onnx"), root / name / "config.pbtxt"
    )

    name, inp, out = MODELS["pytorch"]
    (root / name / "1").mkdir(parents=True)
    torch.jit.script(_Lookup()).save(str(root / name / "1" / "model.pt"))
    write_config(
        _config(name, "pytorch_libtorch", inp, out, "model.pt"), root / name / "config.pbtxt"
    )

    for backend, (name, inp, out) in RAGGED.items():
        plain = MODELS[backend][0]
        filename = "model.onnx" if backend == "onnxruntime" else "model.pt"
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / filename).write_bytes((root / plain / "1" / filename).read_bytes())
        config = _config(
            name,
            "onnxruntime_onnx" if backend == "onnxruntime" else "pytorch_libtorch",
            inp,
            out,
            filename,
        )
        config.input[0].allow_ragged_batch = True
        if backend == "onnxruntime":  # fixed length edges: lengths <= 2 and > 2 run apart
            config.parameters["ragged_length_buckets"].string_value = "2"
        else:  # the cheapest split, a run costing 1000 padded positions: one group padded to the longest
            config.parameters["ragged_run_cost"].string_value = "1000"
        write_config(config, root / name / "config.pbtxt")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repository = _write_repository(tmp_path_factory.mktemp("batching-core"))
    models = [m for m, _, _ in (*MODELS.values(), *RAGGED.values())]
    with TritonServer(repository, models=models, ports=TritonPorts.free()) as triton:
        yield triton


def _send_together(
    url: str, backend: str, batches: list[np.ndarray], ragged: bool = False
) -> list[np.ndarray | str]:
    """Each array as its own request, all at once; each answer's output, or its error message."""
    model, inp, out = (RAGGED if ragged else MODELS)[backend]

    def one(indices: np.ndarray) -> np.ndarray | str:
        client = http.InferenceServerClient(url, network_timeout=60.0)
        tensor = http.InferInput(inp, list(indices.shape), "INT64")
        tensor.set_data_from_numpy(indices)
        try:
            return client.infer(model, [tensor]).as_numpy(out)
        except InferenceServerException as exc:
            return str(exc.message())
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=len(batches)) as pool:
        return list(pool.map(one, batches))


@pytest.mark.parametrize("backend", sorted(MODELS))
def test_one_request_the_runtime_refuses_fails_alone(server: TritonServer, backend: str) -> None:
    model = MODELS[backend][0]
    with http.InferenceServerClient(server.http_url) as client:
        before = counts(client, model)
        requests = [np.array([[0, 1]]), np.array([[2, 7]]), np.array([[3, 3]]), np.array([[-1, 2]])]
        answers = _send_together(server.http_url, backend, requests)

        assert isinstance(answers[1], str), answers[1]
        assert f"model '{model}' could not process this request" in answers[1]
        assert not [leak for leak in LEAKS if leak in answers[1]], answers[1]
        for indices, answer in zip(requests, answers, strict=True):
            if indices.max() < len(TABLE):
                assert isinstance(answer, np.ndarray), answer
                np.testing.assert_array_equal(answer, TABLE[indices])
        change = wait_for_counts(client, model, before, requests=len(requests))
        # The merged batch failed in the runtime and was answered request by request, in one execution.
        assert change.requests == len(requests) and change.executions < len(requests)


@pytest.mark.parametrize("backend", sorted(MODELS))
def test_a_good_batch_runs_once_and_is_split_back(server: TritonServer, backend: str) -> None:
    model = MODELS[backend][0]
    with http.InferenceServerClient(server.http_url) as client:
        before = counts(client, model)
        requests = [np.array([[i % 4, (i + 1) % 4]] * rows) for i, rows in enumerate((1, 2, 1))]
        answers = _send_together(server.http_url, backend, requests)
        for indices, answer in zip(requests, answers, strict=True):
            assert isinstance(answer, np.ndarray), answer
            np.testing.assert_array_equal(answer, TABLE[indices])
        change = wait_for_counts(client, model, before, requests=len(requests))
        assert change.inferences == sum(len(r) for r in requests)
        assert change.executions == 1


def test_the_onnxruntime_backend_logs_its_execution_provider(server: TritonServer) -> None:
    assert any(
        "model 'gather_onnx': instance kind CPU: execution providers CPUExecutionProvider" in line
        for line in server.iter_log()
    )


@pytest.mark.parametrize("backend", sorted(MODELS))
def test_ragged_requests_of_different_lengths_share_one_execution(
    server: TritonServer, backend: str
) -> None:
    """With ``allow_ragged_batch`` the batcher merges requests of three lengths; the core pads each length
    group to its longest, and every request gets its own length back, with its own values."""
    model = RAGGED[backend][0]
    with http.InferenceServerClient(server.http_url) as client:
        before = counts(client, model)
        # BATCH rows in all, three lengths: padded to 2 and 5 apart (onnxruntime) or all to 5 (pytorch)
        requests = [np.array([[3]]), np.array([[1, 2, 3, 0, 1]]), np.array([[2, 1]] * 2)]
        answers = _send_together(server.http_url, backend, requests, ragged=True)
        for indices, answer in zip(requests, answers, strict=True):
            assert isinstance(answer, np.ndarray), answer
            assert answer.shape == indices.shape
            np.testing.assert_array_equal(answer, TABLE[indices])
        change = wait_for_counts(client, model, before, requests=len(requests))
        assert change.inferences == sum(len(r) for r in requests)
        assert change.executions == 1, "requests of different lengths ran in one execution"
