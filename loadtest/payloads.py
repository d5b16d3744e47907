"""Realistic request payloads, built once per process from data that ships with PyPI packages.

- Photographs from ``skimage.data`` (chelsea the cat, coffee, astronaut, ...) encoded as JPEG, for
  ``/v1/classify``.
- Real English sentences for ``/v1/embeddings`` and short prompts for ``/v1/images/generations``.
- The same photographs preprocessed to FP32 ``[1, 3, 224, 224]`` tensors, sent as KServe v2
  requests in the binary tensor extension (a JSON header of ``Inference-Header-Content-Length``
  bytes followed by the raw little-endian tensor bytes): what a client of ``/v2/models/*/infer``
  sends, and the payload every configuration of the benchmark receives.
"""

from __future__ import annotations

import io
import json
from functools import cache

import numpy as np

__all__ = [
    "PROMPTS",
    "SENTENCES",
    "V2Request",
    "image_tensors",
    "jpeg_images",
    "mixed_length_texts",
    "v2_binary_request",
    "v2_output",
]

SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A cat is sleeping on the warm windowsill in the afternoon sun.",
    "Espresso is brewed by forcing hot water through finely ground coffee beans.",
    "The rocket lifted off from the launch pad and disappeared into the clouds.",
    "Interest rates were left unchanged at the central bank's latest meeting.",
    "How do I reset my password if I no longer have access to my email?",
    "The museum's new exhibition features paintings from the early Renaissance.",
    "Regular exercise improves both cardiovascular health and mood.",
    "Our order arrived two days late and the box was damaged.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The train to the airport leaves every fifteen minutes from platform four.",
    "She finished the marathon in just under four hours despite the heat.",
    "Neural networks learn representations by adjusting weights through gradient descent.",
    "Please remember to bring your passport and a printed copy of the ticket.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Astronomers detected water vapour in the atmosphere of a distant exoplanet.",
)

PROMPTS: tuple[str, ...] = (
    "a watercolor painting of a lighthouse at dawn",
    "a cat wearing a tiny astronaut helmet",
    "a cup of espresso on a wooden table, studio lighting",
    "a red rocket over a snowy mountain range",
    "a minimalist logo of a fox, flat vector",
    "an isometric drawing of a cozy library",
)


@cache
def mixed_length_texts(count: int = 256, seed: int = 0) -> tuple[str, ...]:
    """``count`` texts of mixed length, as embedding traffic is: many one-sentence queries, some short
    paragraphs, a few passages near the encoder's 256-token limit (about 12 to 250 tokens).

    Each text joins 1, 2-3, 4-8 or 9-16 of :data:`SENTENCES` (probabilities 0.5, 0.25, 0.15, 0.1),
    drawn with a fixed seed, so every run and every configuration sends the same texts.
    """
    rng = np.random.default_rng(seed)
    groups = ((1, 1), (2, 3), (4, 8), (9, 16))
    texts = []
    for _ in range(count):
        low, high = groups[int(rng.choice(len(groups), p=(0.5, 0.25, 0.15, 0.1)))]
        picked = rng.choice(len(SENTENCES), size=int(rng.integers(low, high + 1)), replace=True)
        texts.append(" ".join(SENTENCES[i] for i in picked))
    return tuple(texts)


@cache
@cache  # encoded once per process: the benchmarks ask for the same files for requests, checks and capacity
def jpeg_images(max_side: int = 512, quality: int = 90) -> tuple[bytes, ...]:
    """The sample photographs (and their mirror images) as JPEG files of at most ``max_side`` px."""
    from PIL import Image

    from builders.samples import sample_images

    encoded = []
    for image in sample_images():
        for variant in (image, image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)):
            copy = variant.convert("RGB")
            copy.thumbnail((max_side, max_side))
            buffer = io.BytesIO()
            copy.save(buffer, format="JPEG", quality=quality)
            encoded.append(buffer.getvalue())
    return tuple(encoded)


@cache
def image_tensors() -> np.ndarray:
    """The photographs preprocessed as the serving ensemble does: FP32 ``[n, 3, 224, 224]``."""
    from builders.families.efficientnet import EfficientNetLite0
    from builders.samples import image_batch

    return np.ascontiguousarray(image_batch(EfficientNetLite0.preprocessing), dtype=np.float32)


class V2Request:
    """A ready-to-send KServe v2 binary request: ``body`` bytes and the ``headers`` it needs."""

    __slots__ = ("body", "headers")

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.body = body
        self.headers = headers


_V2_DATATYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float16): "FP16",
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
    np.dtype(np.uint8): "UINT8",
}


def _binary(array: np.ndarray) -> tuple[str, bytes]:
    """An input's datatype and its bytes in the binary extension (BYTES: each element length-prefixed)."""
    if array.dtype == np.object_:
        from tritonclient.utils import serialize_byte_tensor

        return "BYTES", bytes(serialize_byte_tensor(array).item())
    return _V2_DATATYPES[array.dtype], np.ascontiguousarray(array).tobytes()


def v2_binary_request(inputs: dict[str, np.ndarray], outputs: list[str]) -> V2Request:
    """Encode ``inputs`` in the binary tensor extension, asking for ``outputs`` as binary too."""
    encoded = {name: _binary(a) for name, a in inputs.items()}
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(a.shape),
                "datatype": encoded[name][0],
                "parameters": {"binary_data_size": len(encoded[name][1])},
            }
            for name, a in inputs.items()
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    body = head + b"".join(data for _, data in encoded.values())
    return V2Request(
        body,
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(head)),
        },
    )


def v2_output(body: bytes, header_length: int | None, name: str) -> np.ndarray:
    """Decode one output of a v2 response (binary extension or plain JSON)."""
    if header_length is None:
        doc = json.loads(body)
        out = next(o for o in doc["outputs"] if o["name"] == name)
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    doc = json.loads(body[:header_length])
    offset = header_length
    for out in doc["outputs"]:
        size = out["parameters"]["binary_data_size"]
        if out["name"] == name:
            if out["datatype"] != "FP32":
                raise ValueError(f"output {name} is {out['datatype']}, expected FP32")
            return np.frombuffer(body[offset : offset + size], dtype=np.float32).reshape(
                out["shape"]
            )
        offset += size
    raise KeyError(name)
