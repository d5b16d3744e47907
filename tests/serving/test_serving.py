"""The serving core end to end: real builds, the real Triton binary, HTTP requests."""

from __future__ import annotations

import io
import re
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as http
from PIL import Image
from skimage import data
from tritonclient.utils import InferenceServerException

from builders.export import torch_reference
from builders.registry import get_spec
from tests.support.triton_stats import counts, wait_for_counts

pytestmark = pytest.mark.integration

CAT_CLASSES = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
CUP_CLASSES = {504, 550, 967, 968}  # coffee mug, espresso maker, espresso, cup


def _jpeg(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


def _classify(client: http.InferenceServerClient, payloads: list[bytes]) -> http.InferResult:
    tensor = http.InferInput("IMAGE", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(payloads, dtype=object).reshape(-1, 1))
    return client.infer("image_classifier", [tensor])


@pytest.fixture(scope="module")
def client(triton) -> Iterator[http.InferenceServerClient]:
    client = http.InferenceServerClient(triton.http_url, concurrency=16)
    yield client
    client.close()


def test_ensemble_labels_chelsea_as_a_cat_and_coffee_as_a_cup(client) -> None:
    result = _classify(client, [_jpeg(data.chelsea()), _jpeg(data.coffee())])
    ids = result.as_numpy("CLASS_IDS")
    labels = result.as_numpy("LABELS")
    scores = result.as_numpy("SCORES")
    assert ids.shape == (2, 5) and labels.shape == (2, 5)
    assert CAT_CLASSES & set(ids[0].tolist()), labels[0]
    assert ids[0][0] in CAT_CLASSES
    assert CUP_CLASSES & set(ids[1].tolist()), labels[1]
    assert b"cat" in labels[0][0]
    assert np.all(np.diff(scores, axis=1) <= 0), "scores are sorted best first"
    assert np.all((scores > 0) & (scores <= 1))


def test_png_is_accepted_too(client) -> None:
    buffer = io.BytesIO()
    Image.fromarray(data.chelsea()).save(buffer, format="PNG")
    ids = _classify(client, [buffer.getvalue()]).as_numpy("CLASS_IDS")
    assert ids[0][0] in CAT_CLASSES


@pytest.mark.parametrize("model", ["efficientnet_lite0", "resnet50"])
def test_raw_tensor_call_matches_pytorch(client, model: str) -> None:
    spec = get_spec(model)
    module, _ = spec.load()
    pixels = spec.sample_inputs()["input"][:4]
    (expected,) = torch_reference(module, spec, {"input": pixels})
    tensor = http.InferInput("input", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    logits = client.infer(model, [tensor]).as_numpy("logits")
    assert logits.shape == (4, 1000)
    assert np.max(np.abs(logits - expected)) <= spec.tolerance.max_abs_error
    assert (logits.argmax(1) == expected.argmax(1)).all()


def _metric(metrics_url: str, metric: str, model: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    pattern = re.compile(rf'^{metric}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', re.M)
    return sum(float(v) for v in pattern.findall(text))


def test_concurrent_requests_are_batched(triton, client) -> None:
    model = "efficientnet_lite0"
    before = counts(client, model)
    pixels = get_spec(model).sample_inputs()["input"][:1]

    def one() -> http.InferAsyncRequest:
        tensor = http.InferInput("input", [1, 3, 224, 224], "FP32")
        tensor.set_data_from_numpy(pixels)
        return client.async_infer(model, [tensor])

    # async_infer keeps up to `concurrency` requests in flight (the HTTP client is not thread-safe).
    pending = [one() for _ in range(64)]
    results = [p.get_result().as_numpy("logits") for p in pending]
    assert all(r.shape == (1, 1000) for r in results)
    # Triton records statistics after the answers have left: wait until all 64 are counted.
    change = wait_for_counts(client, model, before, requests=64)
    inferences, executions = change.inferences, change.executions
    assert inferences == 64
    assert executions < inferences, (
        f"{executions} executions for {inferences} inferences: no batching"
    )
    # The same shows in Triton's Prometheus metrics, which is what a dashboard reads.
    assert _metric(triton.metrics_url, "nv_inference_exec_count", model) < _metric(
        triton.metrics_url, "nv_inference_count", model
    )


def _assert_still_serving(client) -> None:
    ids = _classify(client, [_jpeg(data.chelsea())]).as_numpy("CLASS_IDS")
    assert ids[0][0] in CAT_CLASSES


def test_non_image_bytes_are_refused_by_name(client) -> None:
    with pytest.raises(InferenceServerException, match="not a decodable image"):
        _classify(client, [b"definitely not a jpeg"])
    _assert_still_serving(client)


def test_one_bad_image_in_a_batch_fails_only_its_request(client) -> None:
    pending = []
    for i in range(8):
        tensor = http.InferInput("IMAGE", [1, 1], "BYTES")
        tensor.set_data_from_numpy(
            np.array([[b"junk" if i == 3 else _jpeg(data.coffee())]], dtype=object)
        )
        pending.append(client.async_infer("image_classifier", [tensor]))
    outcomes = []
    for request in pending:
        try:
            outcomes.append(request.get_result().as_numpy("CLASS_IDS")[0][0])
        except InferenceServerException as exc:
            outcomes.append(str(exc))
    assert "not a decodable image" in str(outcomes[3])
    assert all(
        isinstance(o, np.integer) and o in CUP_CLASSES for i, o in enumerate(outcomes) if i != 3
    )


@pytest.mark.parametrize(
    ("shape", "datatype", "array", "message"),
    [
        ([1, 3, 100, 100], "FP32", np.zeros((1, 3, 100, 100), np.float32), "unexpected shape"),
        (
            [1, 3, 224, 224],
            "INT32",
            np.zeros((1, 3, 224, 224), np.int32),
            "data-type is .INT32., but model .efficientnet_lite0. expects .FP32.",
        ),
        ([0, 3, 224, 224], "FP32", np.zeros((0, 3, 224, 224), np.float32), "input 'input'"),
    ],
    ids=["wrong-shape", "wrong-dtype", "empty-batch"],
)
def test_bad_tensors_get_a_named_error(client, shape, datatype, array, message) -> None:
    tensor = http.InferInput("input", shape, datatype)
    tensor.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException, match=message):
        client.infer("efficientnet_lite0", [tensor])
    _assert_still_serving(client)


def test_unknown_model_is_refused(client) -> None:
    tensor = http.InferInput("input", [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
    with pytest.raises(InferenceServerException, match="no_such_model"):
        client.infer("no_such_model", [tensor])
