"""Model readiness: READY in Triton and answering one small synthetic inference.

One definition for both readiness probes of the deployment:

- the gateway's ``/readyz`` (:mod:`gateway.readiness`) builds its request with :func:`probe_inputs`;
- the Triton pod's readiness probe runs this file as a script inside the Triton image
  (``python3 model_readiness.py``, models from ``READY_MODELS``), against ``127.0.0.1:8000``.

So this module uses the standard library only, and runs on the Python of the NGC Triton image
(3.10) as well as the platform's.

The synthetic request: batch 1 where the model batches, every required input, dynamic axes of
length 1, zeros for numbers, and for ``BYTES`` inputs what the model card's task reads (a tiny PNG
for ``classification``, a short text otherwise). Optional inputs are left to the model's defaults.

Usage (exit status 0 when every model is ready; otherwise 1, each problem on stderr)::

    READY_MODELS=image_classifier,text_embedding python3 model_readiness.py [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ELEMENT_BYTES",
    "PROBE_TEXT",
    "ProbeInput",
    "infer_body",
    "main",
    "model_problems",
    "parse_model_list",
    "probe_inputs",
    "probe_png",
]

PROBE_TEXT = b"readiness probe"
#: bytes per element of each fixed-size KServe v2 datatype (tests check it against tritonclient's table)
ELEMENT_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
                 "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8}
_CLASSIFICATION = "classification"  # serving.model_card.Task.CLASSIFICATION (no import: stdlib only here)
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ProbeInput:
    """One input of the synthetic request: ``value`` fills every element of a ``BYTES`` input;
    other datatypes are zeros."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    value: bytes | None = None

    @property
    def count(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


def probe_png(size: int = 8) -> bytes:
    """A ``size`` x ``size`` grey RGB PNG, encoded with the standard library (zlib + CRC chunks)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    rows = b"".join(b"\x00" + b"\x80" * (3 * size) for _ in range(size))  # filter 0 per row
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _task(config: Mapping[str, Any]) -> str:
    value = config.get("parameters", {}).get("task", {})
    return str(value.get("string_value", "")) if isinstance(value, Mapping) else ""


def probe_inputs(config: Mapping[str, Any]) -> list[ProbeInput]:
    """The smallest valid request for a model, from Triton's JSON model configuration.

    Args:
        config: what ``GET /v2/models/<m>/config`` answers.

    Raises:
        ValueError: an input's datatype is not one of the protocol's.
    """
    batched = int(config.get("max_batch_size", 0) or 0) > 0
    task = _task(config)
    inputs = []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        dims = tuple(1 if int(d) < 0 else int(d) for d in spec.get("dims", []))
        shape = ((1,) if batched else ()) + dims
        datatype = str(spec.get("data_type", "")).removeprefix("TYPE_")
        if datatype == "STRING":
            inputs.append(ProbeInput(str(spec["name"]), "BYTES", shape,
                                     probe_png() if task == _CLASSIFICATION else PROBE_TEXT))
        elif datatype in ELEMENT_BYTES:
            inputs.append(ProbeInput(str(spec["name"]), datatype, shape))
        else:
            raise ValueError(f"input '{spec.get('name')}' has datatype {datatype!r}, which no probe can fill")
    return inputs


def infer_body(inputs: Sequence[ProbeInput]) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 inference body in the binary tensor extension, and its headers."""
    header: dict[str, Any] = {"inputs": [], "outputs": []}
    blobs = []
    for item in inputs:
        if item.datatype == "BYTES":
            value = item.value or b""
            blob = (struct.pack("<I", len(value)) + value) * item.count
        else:
            blob = bytes(ELEMENT_BYTES[item.datatype] * item.count)
        header["inputs"].append({"name": item.name, "datatype": item.datatype, "shape": list(item.shape),
                                 "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(head))}


def _call(url: str, timeout_s: float, body: bytes | None = None,
          headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}), method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (our own Triton)
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _error(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("error", ""))[:300]
    except (ValueError, AttributeError):
        return payload[:300].decode(errors="replace")


def model_problems(base_url: str, models: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """What keeps each of ``models`` from serving on the Triton at ``base_url`` (empty: all ready).

    Each entry names the model: not READY, its configuration unreadable, or the synthetic inference
    refused (with Triton's message). Connection errors count as a problem of every model.
    """
    problems = []
    for model in models:
        path = f"{base_url.rstrip('/')}/v2/models/{urllib.parse.quote(model, safe='')}"
        try:
            status, _ = _call(path + "/ready", timeout_s)
            if status != 200:
                problems.append(f"{model}: not READY in Triton (HTTP {status})")
                continue
            status, payload = _call(path + "/config", timeout_s)
            if status != 200:
                problems.append(f"{model}: configuration unreadable (HTTP {status}: {_error(payload)})")
                continue
            body, headers = infer_body(probe_inputs(json.loads(payload)))
            status, payload = _call(path + "/infer", timeout_s, body, headers)
            if status != 200:
                problems.append(f"{model}: synthetic inference failed (HTTP {status}: {_error(payload)})")
        except (OSError, ValueError) as exc:  # unreachable, timed out, or an unusable configuration
            problems.append(f"{model}: {exc}")
    return problems


def parse_model_list(text: str) -> list[str]:
    """``"a,b"``, ``"a b"`` or a JSON list, as the ``READY_MODELS`` / ``GATEWAY_READY_MODELS`` value."""
    text = text.strip()
    items = json.loads(text) if text.startswith("[") else text.replace(",", " ").split()
    return list(dict.fromkeys(str(item) for item in items))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Exit 0 when every model is READY in Triton and answers one synthetic inference "
        "(the Triton pod's readiness probe)."
    )
    parser.add_argument("--url", default=DEFAULT_URL, help="Triton's HTTP base URL (default %(default)s)")
    parser.add_argument("--models", default=os.environ.get("READY_MODELS", ""),
                        help="comma-separated models (default: $READY_MODELS)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    args = parser.parse_args(argv)
    models = parse_model_list(args.models)
    if not models:
        print("no models to check: set READY_MODELS or --models", file=sys.stderr)
        return 2
    problems = model_problems(args.url, models, args.timeout_s)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
