"""Image files a hostile client sends: decompression bombs, lying headers, extreme aspect ratios.

Each is built without ever holding its decoded pixels: PNG rows are streamed through zlib, and the
other formats are small real files whose headers are rewritten. A 20000x20000 bomb costs about
60 KB here and 400 MB (or more) in a decoder that trusts it.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable

import numpy as np
from PIL import Image

__all__ = [
    "bmp_claiming",
    "gif_canvas",
    "good_jpeg",
    "jpeg_claiming",
    "png",
    "png_broken_chunk",
    "png_text_bomb",
    "png_without_data",
    "real_image",
]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# color type -> channels (0 gray, 2 RGB, 4 gray+alpha, 6 RGBA)
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def png(
    width: int, height: int, *, color_type: int = 0, bit_depth: int = 8, value: int = 0
) -> bytes:
    """A valid PNG of ``width`` x ``height`` pixels, all ``value``; rows are compressed one by one."""
    row_bytes = (width * _CHANNELS[color_type] * bit_depth + 7) // 8
    row = b"\x00" + bytes([value]) * row_bytes  # filter type 0, then the pixels
    packer = zlib.compressobj(9)
    parts = [packer.compress(row) for _ in range(height)]
    idat = b"".join(parts) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return _PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png_broken_chunk() -> bytes:
    """A PNG whose pixel data continues in a chunk with a corrupt type: Pillow opens it, and its
    ``load()`` raises ``SyntaxError`` (neither ``OSError`` nor ``ValueError``)."""
    good = png(20, 20, color_type=2, value=7)
    at = good.index(b"IDAT") - 4
    (length,) = struct.unpack(">I", good[at : at + 4])
    idat = good[at + 8 : at + 8 + length]
    half = len(idat) // 2
    broken = _chunk(b"IDAT", idat[:half]) + _chunk(b"ID&T", idat[half:])
    return good[:at] + broken + _chunk(b"IEND", b"")


def png_without_data(width: int, height: int) -> bytes:
    """A PNG header claiming ``width`` x ``height`` pixels, with no pixel data at all."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return _PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IEND", b"")


def png_text_bomb(megabytes: int = 64) -> bytes:
    """A 1x1 PNG whose compressed text chunk inflates to ``megabytes`` MB."""
    packer = zlib.compressobj(9)
    text = b"".join(packer.compress(b"\x00" * (1 << 20)) for _ in range(megabytes)) + packer.flush()
    base = png(1, 1)
    end = base.index(b"IDAT") - 4
    return base[:end] + _chunk(b"zTXt", b"Comment\x00\x00" + text) + base[end:]


def real_image(width: int, height: int, fmt: str, mode: str = "RGB", **save: object) -> bytes:
    """A small real image file (a gradient) written by Pillow."""
    gradient = (np.arange(width * height * 3, dtype=np.uint32) % 251).astype(np.uint8)
    image = Image.fromarray(gradient.reshape(height, width, 3), "RGB").convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


def good_jpeg() -> bytes:
    """A photo the classifier answers for (skimage's chelsea the cat)."""
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.chelsea()).save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def _patched(data: bytes, find: Callable[[bytes], int], packed: bytes) -> bytes:
    at = find(data)
    return data[:at] + packed + data[at + len(packed) :]


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header (SOF0) claims ``width`` x ``height``."""
    data = real_image(16, 16, "JPEG")
    return _patched(data, lambda d: d.index(b"\xff\xc0") + 5, struct.pack(">HH", height, width))


def gif_canvas(width: int, height: int) -> bytes:
    """A 1x1 GIF whose logical screen claims ``width`` x ``height``."""
    data = real_image(1, 1, "GIF", mode="P")
    return data[:6] + struct.pack("<HH", width, height) + data[10:]


def bmp_claiming(width: int, height: int) -> bytes:
    """A 2x2 BMP whose info header claims ``width`` x ``height`` (and holds 2x2 pixels)."""
    data = real_image(2, 2, "BMP")
    return data[:18] + struct.pack("<ii", width, height) + data[26:]
