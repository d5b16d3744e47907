"""Encoded test images: the real photographs and every awkward kind of file a client can send.

Each hostile or unusual image is made here from a real photograph (or from nothing), in memory, so
the tests of the preprocessing module and of the served ensemble send exactly the same bytes.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable

import numpy as np
from PIL import Image
from skimage import data

__all__ = ["AWKWARD", "HOSTILE", "encode", "photo", "png_header_only"]


def photo(name: str) -> Image.Image:
    """A real photograph from ``skimage.data`` (``chelsea``: a tabby cat; ``coffee``: an espresso)."""
    return Image.fromarray(np.ascontiguousarray(getattr(data, name)()[..., :3]))


def encode(image: Image.Image, fmt: str = "PNG", **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` but carries almost no data (a decompression
    bomb's header)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
        )

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + chunk(b"IEND", b"")
    )


def _exif_rotated(name: str) -> bytes:
    """The photograph stored on its side with EXIF orientation 6 (rotate 90 degrees clockwise to view)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(
        photo(name).transpose(Image.Transpose.ROTATE_90), "JPEG", quality=92, exif=exif.tobytes()
    )


def _sixteen_bit(name: str) -> bytes:
    grey = np.asarray(photo(name).convert("L"), dtype=np.uint16) * 257
    return encode(Image.fromarray(grey))


#: files the preprocessing must refuse, each with words its message must contain
HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "8000x1 png": (lambda: encode(Image.new("1", (8000, 1))), "aspect ratio"),
    "huge declared size": (lambda: png_header_only(30_000, 30_000), "larger than"),
    "truncated jpeg": (lambda: encode(photo("chelsea"), "JPEG")[:4000], "truncated or corrupt"),
    "truncated png": (lambda: encode(photo("chelsea"))[:5000], "truncated or corrupt"),
    "not an image": (lambda: b"definitely not a jpeg", "not a decodable image"),
    "empty": (lambda: b"", "not a decodable image"),
}

#: unusual but valid encodings of a real photograph: (photo name, bytes)
AWKWARD: dict[str, tuple[str, Callable[[], bytes]]] = {
    "cmyk jpeg": ("chelsea", lambda: encode(photo("chelsea").convert("CMYK"), "JPEG", quality=95)),
    "palette png": (
        "coffee",
        lambda: encode(photo("coffee").convert("P", palette=Image.Palette.ADAPTIVE)),
    ),
    "16-bit grey png": ("chelsea", lambda: _sixteen_bit("chelsea")),
    "rgba png": ("coffee", lambda: encode(photo("coffee").convert("RGBA"))),
    "exif-rotated jpeg": ("chelsea", lambda: _exif_rotated("chelsea")),
}
