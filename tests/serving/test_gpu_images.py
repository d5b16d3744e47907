"""The GPU image preprocessing: header checks before any allocation, Pillow-equal pixels, limits.

Runs on the CPU (Pillow decode, the same torch resize); the ``gpu`` test decodes with nvJPEG.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch

from loadtest.payloads import jpeg_images
from serving.gpu_images import (
    DecodeLimits,
    ImageError,
    Preprocessing,
    decode,
    host_bytes,
    preprocess_into,
    read_header,
)
from serving.image_preprocessing import preprocess_bytes
from serving.limits import DEFAULT_LIMITS

P = Preprocessing()


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    return b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    )


def test_default_limits_are_the_platforms() -> None:
    limits = DEFAULT_LIMITS.image_decode
    assert DecodeLimits() == DecodeLimits(
        limits.max_source_pixels, limits.max_aspect_ratio, limits.max_resized_pixels
    )


def test_jpeg_header_is_read_without_decoding() -> None:
    from PIL import Image

    for data in jpeg_images()[:4]:
        header = read_header(memoryview(data), P)
        with Image.open(io.BytesIO(data)) as image:
            assert (header.format, header.width, header.height, header.gpu) == (
                "jpeg",
                image.width,
                image.height,
                True,
            )


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"plain text, not an image", "not a decodable image"),
        (_png(8000, 1), "aspect ratio"),
        (_png(30_000, 30_000), "larger than"),
        (_png(0, 10), "no pixels"),
        (b"\xff\xd8\xff\xe0\x00\x01", "corrupt JPEG"),
        (b"\xff\xd8\xff\xda\x00\x08" + b"\x00" * 8, "no frame header"),
    ],
)
def test_bad_headers_are_refused(data: bytes, words: str) -> None:
    with pytest.raises(ImageError, match=words):
        read_header(memoryview(data), P)


def test_only_whole_jpegs_go_to_nvjpeg() -> None:
    """A truncated JPEG is decoded on the host, which refuses it by name; padding is not truncation."""
    data = jpeg_images()[2]
    assert read_header(memoryview(data), P).gpu
    assert read_header(memoryview(data + bytes(5_000)), P).gpu  # a row padded to a longer image
    truncated = data[: len(data) // 3]
    header = read_header(memoryview(truncated), P)
    assert (header.format, header.gpu) == ("jpeg", False)
    assert not read_header(memoryview(truncated + bytes(100)), P).gpu
    decoded = decode(
        [torch.frombuffer(bytearray(truncated), dtype=torch.uint8)], [header], torch.device("cpu")
    )
    assert decoded.images == [None] and "not a decodable image" in str(decoded.errors[0])


def test_resized_size_limit() -> None:
    with pytest.raises(ImageError, match="would be resized"):
        read_header(memoryview(_png(4000, 1000)), P, DecodeLimits(max_resized_pixels=100_000))


def test_host_bytes_is_a_view_of_the_tensor() -> None:
    tensor = torch.tensor([1, 2, 3], dtype=torch.uint8)
    view = host_bytes(tensor)
    tensor[0] = 9
    assert bytes(view) == b"\x09\x02\x03"


def test_pixels_match_the_cpu_preprocessing() -> None:
    images = jpeg_images()
    decoded = decode(
        [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in images],
        [read_header(memoryview(d), P) for d in images],
        torch.device("cpu"),
    )
    assert decoded.errors == [None] * len(images)
    out = torch.zeros(len(images), 3, P.size, P.size)
    preprocess_into(decoded.images, out, P)  # type: ignore[arg-type]
    reference = np.stack([preprocess_bytes(d) for d in images])
    # One 8-bit level (2/255 after normalising) at most, on a few pixels: fixed vs floating point.
    diff = np.abs(out.numpy() - reference)
    assert diff.max() <= 2 / 255 + 1e-6 and (diff > 1e-6).mean() < 0.005


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA")
def test_gpu_decode_matches_the_cpu_preprocessing_closely() -> None:
    images = jpeg_images()
    good = bytearray(images[0])
    encoded = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in images]
    encoded.append(
        torch.frombuffer(good[: len(good) // 4] + b"\x00" * 16, dtype=torch.uint8)
    )  # truncated
    headers = [read_header(host_bytes(e), P) for e in encoded]
    decoded = decode(encoded, headers, torch.device("cuda"))
    assert all(e is None for e in decoded.errors[:-1])
    out = torch.zeros(len(images), 3, P.size, P.size, device="cuda")
    preprocess_into(decoded.images[: len(images)], out, P)  # type: ignore[arg-type]
    reference = np.stack([preprocess_bytes(d) for d in images])
    diff = np.abs(out.cpu().numpy() - reference)
    # nvJPEG's IDCT and chroma upsampling differ from libjpeg's by a few levels on some pixels.
    assert diff.mean() < 0.02, diff.mean()
