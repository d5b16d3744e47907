"""Hostile and unusual images through the served ``image_classifier`` ensemble (the real Triton).

Each image is its own request, all sent at once to a Triton whose preprocessing model waits up to a
second to fill a batch (the built entry otherwise), so they meet in its batches:
every hostile one fails alone with a 4xx-class message naming the problem (no library message, path
or traceback), every photograph beside them still gets its label, Triton is the same process
afterwards, and the preprocessing stub did not grow by anything like a decoded bomb.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from builders.triton_config import read_config, write_config
from serving.launcher import TritonPorts, TritonServer
from tests.support.images import AWKWARD, HOSTILE, encode, photo
from tests.support.triton_stats import counts, wait_for_counts
from tests.support.variant_repos import copy_entries

pytestmark = pytest.mark.integration

CAT_CLASSES = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
CUP_CLASSES = {504, 550, 967, 968}  # coffee mug, espresso maker, espresso, cup
EXPECTED = {"chelsea": CAT_CLASSES, "coffee": CUP_CLASSES}
LIBRARY_WORDS = ("PIL", "Traceback", ".py", 'File "', "cannot identify", "Errno", "stub")


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _preprocess_stubs(triton_pid: int) -> list[int]:
    import psutil

    return [
        p.pid
        for p in psutil.Process(triton_pid).children(recursive=True)
        if any("image_preprocess" in part for part in p.cmdline())
    ]


PIPELINE_ENTRIES = (
    "image_classifier",
    "image_preprocess",
    "efficientnet_lite0",
    "image_postprocess",
)


@pytest.fixture(scope="module")
def pipeline_triton(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """The pipeline's built entries; the preprocessing batches requests that arrive within a second.
    With its own short delay, two instances keep up with a burst of small images on an idle machine
    and each would run alone."""
    repository = copy_entries(
        model_repository, tmp_path_factory.mktemp("image-limits"), PIPELINE_ENTRIES
    )
    path = repository / "image_preprocess" / "config.pbtxt"
    config = read_config(path)
    config.dynamic_batching.max_queue_delay_microseconds = 1_000_000
    write_config(config, path)
    with TritonServer(
        repository, models=list(PIPELINE_ENTRIES), ports=TritonPorts.free()
    ) as server:
        yield server


def test_every_bad_image_fails_alone_beside_good_ones(pipeline_triton: TritonServer) -> None:
    with http.InferenceServerClient(
        pipeline_triton.http_url, concurrency=24, network_timeout=120.0
    ) as client:
        _check_bad_images_fail_alone(pipeline_triton, client)


def _check_bad_images_fail_alone(triton: TritonServer, client: http.InferenceServerClient) -> None:
    pid = triton.pid
    stubs = {stub: _peak_rss_kib(stub) for stub in _preprocess_stubs(pid)}
    assert stubs, "no preprocessing stub process found"
    before = counts(client, "image_preprocess")

    good = [
        (f"{name} jpeg", name, encode(photo(name), "JPEG", quality=92))
        for name in ("chelsea", "coffee")
    ]
    good += [(label, source, make()) for label, (source, make) in AWKWARD.items()]
    bad = [(label, words, make()) for label, (make, words) in HOSTILE.items()]
    payloads = [p for _, _, p in good] + [p for _, _, p in bad] + [p for _, _, p in good]

    pending = []
    for payload in payloads:
        tensor = http.InferInput("IMAGE", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
        pending.append(client.async_infer("image_classifier", [tensor]))
    outcomes: list[object] = []
    for request in pending:
        try:
            outcomes.append(request.get_result().as_numpy("CLASS_IDS")[0].tolist())
        except InferenceServerException as exc:
            outcomes.append(str(exc.message()))

    labelled = good + [("", "", b"")] * len(bad) + good
    for (label, source, _), outcome in zip(labelled, outcomes, strict=True):
        if label:
            assert isinstance(outcome, list), f"{label}: {outcome}"
            assert outcome[0] in EXPECTED[source], f"{label}: top-5 {outcome}"
    for (label, words, _), outcome in zip(
        bad, outcomes[len(good) : len(good) + len(bad)], strict=True
    ):
        assert isinstance(outcome, str), f"{label} was accepted: {outcome}"
        assert words in outcome, f"{label}: {outcome}"
        assert not [w for w in LIBRARY_WORDS if w in outcome], f"{label}: {outcome}"

    change = wait_for_counts(client, "image_preprocess", before, requests=len(payloads))
    assert change.executions < len(payloads), "the images never shared a batch"
    assert triton.pid == pid and triton.running()
    for stub, peak in stubs.items():
        grown_mib = (_peak_rss_kib(stub) - peak) / 1024
        assert grown_mib < 300, f"preprocessing stub {stub} peak RSS grew by {grown_mib:.0f} MiB"
