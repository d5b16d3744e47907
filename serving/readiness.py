"""Model readiness: READY in Triton and answering one small synthetic inference.

One definition for both readiness probes of the deployment:

- the gateway's ``/readyz`` (:mod:`gateway.backends.readiness`) builds its request with :func:`probe_inputs`;
- the Triton pod's readiness probe runs this file as a script inside the Triton image
  (``python3 model_readiness.py``, models from ``READY_MODELS``), against ``127.0.0.1:8000``.

So this module uses the standard library only, and runs on the Python of the NGC Triton image
(3.10) as well as the platform's.

The synthetic request (:func:`probe_inputs`), built from the model's own configuration and card
(its ``parameters``, :mod:`serving.model_card`'s vocabulary):

- batch 1 where the model batches, dynamic axes of length 1, zeros for numbers;
- every required input; optional ones are left to the model's defaults, except that a model whose
  inputs are all optional (``text_embedding``: TEXT or TOKEN_IDS) gets one, its first ``BYTES`` input
  (the payload a task reads), else its first input: a request with no input at all is refused;
- ``BYTES`` inputs carry what the card's task reads: a tiny PNG for ``classification`` and for an
  input named like an image (a pipeline's preprocessing step has no task of its own), a short text
  otherwise;
- a generation model (task ``image-generation``) is asked for its cheapest image: the fewest steps
  and the smallest side its ``limit_*`` parameters allow (:mod:`serving.limits`), never its defaults
  (25 steps at 512x512 would take a CPU most of a minute).

Usage (exit status 0 when every model is ready; otherwise 1, each problem on stderr)::

    READY_MODELS=image_classifier,text_embedding python3 model_readiness.py [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import math
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
ELEMENT_BYTES = {
    "BOOL": 1,
    "UINT8": 1,
    "INT8": 1,
    "UINT16": 2,
    "INT16": 2,
    "FP16": 2,
    "BF16": 2,
    "UINT32": 4,
    "INT32": 4,
    "FP32": 4,
    "UINT64": 8,
    "INT64": 8,
    "FP64": 8,
}
# serving.model_card.Task values (no import: stdlib only here)
_CLASSIFICATION = "classification"
_IMAGE_GENERATION = "image-generation"
#: a generation model's optional inputs the probe sets to their cheapest values (the pipeline's names)
_GENERATION_INPUTS = ("STEPS", "HEIGHT", "WIDTH")
#: struct format of each fixed-size datatype's element (little endian), for values other than zero
_STRUCT = {
    "BOOL": "?",
    "UINT8": "B",
    "INT8": "b",
    "UINT16": "H",
    "INT16": "h",
    "FP16": "e",
    "UINT32": "I",
    "INT32": "i",
    "FP32": "f",
    "UINT64": "Q",
    "INT64": "q",
    "FP64": "d",
}
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ProbeInput:
    """One input of the synthetic request: ``value`` fills every element of a ``BYTES`` input;
    other datatypes are ``number`` (zero unless the card asks for another value)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    value: bytes | None = None
    number: float = 0

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def probe_png(size: int = 8) -> bytes:
    """A ``size`` x ``size`` grey RGB PNG, encoded with the standard library (zlib + CRC chunks)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    rows = b"".join(b"\x00" + b"\x80" * (3 * size) for _ in range(size))  # filter 0 per row
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _parameters(config: Mapping[str, Any]) -> dict[str, str]:
    raw = config.get("parameters") or {}
    return {
        str(k): str(v.get("string_value", "")) if isinstance(v, Mapping) else str(v)
        for k, v in raw.items()
    }


def _int_parameter(parameters: Mapping[str, str], key: str, default: int) -> int:
    text = parameters.get(key, "").strip()
    return int(text) if text.isdigit() else default


def _generation_numbers(parameters: Mapping[str, str]) -> dict[str, float]:
    """The cheapest image a generation model's limits allow: input name -> value."""
    steps = max(1, _int_parameter(parameters, "limit_min_steps", 1))
    multiple = max(1, _int_parameter(parameters, "limit_side_multiple", 8))
    least = max(1, _int_parameter(parameters, "limit_min_side", 64))
    side = (
        -(-least // multiple) * multiple
    )  # the smallest multiple of ``multiple`` >= the minimum side
    return {"STEPS": steps, "HEIGHT": side, "WIDTH": side}


def _chosen(specs: Sequence[Mapping[str, Any]], generation: bool) -> list[Mapping[str, Any]]:
    """The inputs the probe sends: the required ones, one optional payload when none is required,
    and a generation model's size and steps."""
    required = [spec for spec in specs if not spec.get("optional")]
    if not required and specs:
        payload = [
            spec for spec in specs if str(spec.get("data_type", "")) in ("TYPE_STRING", "BYTES")
        ]
        required = [(payload or list(specs))[0]]
    return [
        spec
        for spec in specs
        if any(spec is chosen for chosen in required)
        or (generation and spec.get("optional") and str(spec.get("name")) in _GENERATION_INPUTS)
    ]


def probe_inputs(config: Mapping[str, Any]) -> list[ProbeInput]:
    """The smallest valid request for a model, from Triton's JSON model configuration and its card.

    Args:
        config: what ``GET /v2/models/<m>/config`` answers.

    Returns:
        The inputs to send, in the configuration's order (the module docstring says which).

    Raises:
        ValueError: an input's datatype is not one of the protocol's.
    """
    batched = int(config.get("max_batch_size", 0) or 0) > 0
    parameters = _parameters(config)
    task = parameters.get("task", "")
    generation = task == _IMAGE_GENERATION
    numbers = _generation_numbers(parameters) if generation else {}
    inputs = []
    for spec in _chosen(list(config.get("input", [])), generation):
        name = str(spec["name"])
        dims = tuple(1 if int(d) < 0 else int(d) for d in spec.get("dims", []))
        shape = ((1,) if batched else ()) + dims
        datatype = str(spec.get("data_type", "")).removeprefix("TYPE_")
        if datatype == "STRING":
            image = task == _CLASSIFICATION or "IMAGE" in name.upper()
            inputs.append(ProbeInput(name, "BYTES", shape, probe_png() if image else PROBE_TEXT))
        elif datatype in ELEMENT_BYTES:
            inputs.append(ProbeInput(name, datatype, shape, number=numbers.get(name, 0)))
        else:
            raise ValueError(f"input '{name}' has datatype {datatype!r}, which no probe can fill")
    return inputs


def infer_body(inputs: Sequence[ProbeInput]) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 inference body in the binary tensor extension, and its headers."""
    header: dict[str, Any] = {"inputs": [], "outputs": []}
    blobs = []
    for item in inputs:
        if item.datatype == "BYTES":
            value = item.value or b""
            blob = (struct.pack("<I", len(value)) + value) * item.count
        elif item.number and item.datatype in _STRUCT:
            kind = _STRUCT[item.datatype]
            number = item.number if kind in "efd" else int(item.number)
            blob = struct.pack(f"<{item.count}{kind}", *([number] * item.count))
        else:
            blob = bytes(ELEMENT_BYTES[item.datatype] * item.count)
        header["inputs"].append(
            {
                "name": item.name,
                "datatype": item.datatype,
                "shape": list(item.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


def _call(
    url: str, timeout_s: float, body: bytes | None = None, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=body, headers=dict(headers or {}), method="POST" if body else "GET"
    )
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


def model_problems(
    base_url: str, models: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[str]:
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
                problems.append(
                    f"{model}: configuration unreadable (HTTP {status}: {_error(payload)})"
                )
                continue
            body, headers = infer_body(probe_inputs(json.loads(payload)))
            status, payload = _call(path + "/infer", timeout_s, body, headers)
            if status != 200:
                problems.append(
                    f"{model}: synthetic inference failed (HTTP {status}: {_error(payload)})"
                )
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
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="Triton's HTTP base URL (default %(default)s)"
    )
    parser.add_argument(
        "--models",
        default=os.environ.get("READY_MODELS", ""),
        help="comma-separated models (default: $READY_MODELS)",
    )
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
