"""The side-by-side benchmark's first request to each configuration, before any load: it must answer,
and with what the configuration is for (1000 logits for a tensor, five class ids for a JPEG). A
configuration that cannot answer fails the run with its error instead of a table of refusals."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np

from loadtest.bench.settings import JPEG_CONFIGS
from loadtest.loadgen import HttpTarget, Target, TritonTarget
from serving.triton_clients import triton_client

__all__ = ["first_top1"]


def first_top1(target: Target, output_name: str) -> int:
    """One request before the load; returns its top-1 class. A tensor answer must decode to 1000
    logits, a JPEG answer (the pipeline's or the naive server's) must name five classes."""
    jpeg = target.name in JPEG_CONFIGS
    if isinstance(target, HttpTarget):
        body, headers = target.requests[0]
        request = urllib.request.Request(
            target.url, data=body, headers={**headers, **target.headers}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                answer = response.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(
                f"{target.name}: {target.url} answered {exc.code}: {exc.read()[:500]!r}"
            ) from exc
        values = (
            np.asarray(json.loads(answer)["class_ids"])
            if jpeg
            else np.frombuffer(answer, dtype=np.float32)
        )
    else:
        assert isinstance(target, TritonTarget)
        import tritonclient.grpc as grpc_client
        import tritonclient.http as http_client
        from tritonclient.utils import np_to_triton_dtype

        module: Any = grpc_client if target.protocol == "grpc" else http_client
        client = triton_client(target.url, target.protocol)
        tensors = []
        for name, array in target.inputs[0].items():
            tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        try:
            result = client.infer(target.model, tensors, headers=dict(target.headers) or None)
        except Exception as exc:  # tritonclient's own errors: the configuration cannot run
            raise RuntimeError(
                f"{target.name}: {target.url} failed the first request: {exc}"
            ) from exc
        finally:
            client.close()
        values = np.asarray(result.as_numpy("CLASS_IDS" if jpeg else output_name))
    expected = 5 if jpeg else 1000
    if values.size != expected:
        raise RuntimeError(
            f"{target.name}: expected {expected} {'class ids' if jpeg else 'logits'}, got {values.size}"
        )
    return int(values.flat[0]) if jpeg else int(np.argmax(values))
