"""Hostile images and uploads for the gateway's image routes: decompression bombs, lying headers,
unusual but valid images, and malformed multipart uploads.

See :mod:`tests.support.hostile_corpus` for the case types.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import numpy as np
from PIL import Image

from gateway.protocol.kserve import InferRequest, InputTensor, encode_rest
from tests.support.hostile_corpus import (
    INTERNALS,
    SERVING,
    Hostile,
    HttpAttempt,
    raw_body,
)
from tests.support.hostile_images import (
    bmp_claiming,
    gif_canvas,
    good_jpeg,
    jpeg_claiming,
    png,
    png_broken_chunk,
    png_text_bomb,
    png_without_data,
    real_image,
)

__all__ = ["image_cases", "image_kserve_body", "upload_cases"]


def image_kserve_body(images: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """A binary KServe v2 body for ``image_classifier`` holding ``images`` (one per batch row)."""
    tensor = InputTensor.from_numpy("IMAGE", np.array([[b] for b in images], dtype=np.object_))
    return encode_rest(InferRequest(inputs=(tensor,)))


def _truncated_jpeg() -> bytes:
    data = good_jpeg()
    return data[: len(data) // 2]


def _animated_gif(frames: int) -> bytes:
    images = [Image.new("P", (64, 64), i % 256) for i in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:])
    return buffer.getvalue()


def _exif_rotated() -> bytes:
    image = Image.fromarray(np.full((40, 60, 3), 128, dtype=np.uint8))
    exif = image.getexif()
    exif[0x0112] = 6  # orientation: rotate 90
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif)
    return buffer.getvalue()


#: (label, builder, acceptable statuses, owner when a model-side fix is needed)
_IMAGES: list[tuple[str, Callable[[], bytes], tuple[int, ...], str | None]] = [
    ("png-8000x1", lambda: png(8000, 1), (400,), SERVING),
    ("png-1x8000", lambda: png(1, 8000), (400,), SERVING),
    ("png-30000x30", lambda: png(30000, 30), (400,), SERVING),
    ("png-2000x80-aspect-25", lambda: png(2000, 80), (400,), SERVING),
    ("png-9000x9000-1bit", lambda: png(9000, 9000, bit_depth=1), (400,), None),
    ("png-6000x6000-gray", lambda: png(6000, 6000), (400,), SERVING),
    ("png-20000x20000-bomb", lambda: png(20000, 20000, bit_depth=1), (400,), None),
    ("png-header-only-65535", lambda: png_without_data(65535, 65535), (400,), None),
    ("png-header-only-4000", lambda: png_without_data(4000, 4000), (400,), None),
    ("png-ztxt-bomb", lambda: png_text_bomb(16), (400,), SERVING),
    ("png-broken-chunk", png_broken_chunk, (400,), SERVING),
    ("jpeg-claims-65500", lambda: jpeg_claiming(65500, 65500), (400,), None),
    ("jpeg-claims-9000", lambda: jpeg_claiming(9000, 9000), (400,), None),
    ("jpeg-claims-20000x1", lambda: jpeg_claiming(20000, 1), (400,), SERVING),
    ("jpeg-truncated", _truncated_jpeg, (400,), None),
    ("gif-canvas-65535", lambda: gif_canvas(65535, 65535), (400,), None),
    ("gif-canvas-6000", lambda: gif_canvas(6000, 6000), (400,), SERVING),
    ("bmp-claims-60000", lambda: bmp_claiming(60000, 60000), (400,), None),
    ("bmp-claims-6000", lambda: bmp_claiming(6000, 6000), (400,), None),
    ("gif-magic-garbage", lambda: b"GIF89a" + bytes(range(256)) * 4, (400,), None),
    ("riff-wave", lambda: b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\0" * 64, (400,), None),
    ("png-signature-only", lambda: b"\x89PNG\r\n\x1a\n", (400,), None),
    ("text-file", lambda: b"this is not an image, it is text\n" * 10, (400,), None),
    (
        "svg",
        lambda: b'<svg xmlns="http://www.w3.org/2000/svg" width="99999" height="99999"/>',
        (400,),
        None,
    ),
    # Unusual but valid: answered, not refused.
    ("png-1x1", lambda: png(1, 1), (200,), None),
    ("png-1000x60-aspect-16", lambda: png(1000, 60), (200,), None),
    ("png-palette", lambda: real_image(32, 32, "PNG", mode="P"), (200,), None),
    ("png-rgba", lambda: real_image(32, 32, "PNG", mode="RGBA"), (200,), None),
    ("png-16bit", lambda: png(48, 48, bit_depth=16, value=200), (200,), None),
    ("jpeg-cmyk", lambda: real_image(32, 32, "JPEG", mode="CMYK"), (200,), None),
    ("jpeg-exif-rotated", _exif_rotated, (200,), None),
    ("gif-animated-300", lambda: _animated_gif(300), (200,), None),
    ("webp-small", lambda: real_image(32, 32, "WEBP"), (200,), None),
    ("bmp-small", lambda: real_image(16, 16, "BMP"), (200,), None),
]


def image_cases() -> Iterator[Hostile]:
    f = "image-bombs"

    def upload(
        build: Callable[[], bytes],
    ) -> Callable[[], list[tuple[str, tuple[str, bytes, str]]]]:
        return lambda: [("file", ("x", build(), "application/octet-stream"))]

    for label, build, expect, owner in _IMAGES:
        mentions = ("image", "file", "IMAGE") if expect != (200,) else ()
        yield Hostile(
            f"{f}/classify/{label}",
            f,
            HttpAttempt(
                "POST",
                "/v1/classify",
                files=upload(build),
            ),
            frozenset(expect),
            mentions,
            owner,
            INTERNALS,
        )

        def kserve(b: Callable[[], bytes] = build) -> tuple[bytes, dict[str, str]]:
            return image_kserve_body([b()])

        yield Hostile(
            f"{f}/kserve/{label}",
            f,
            HttpAttempt("POST", "/v2/models/image_classifier/infer", kserve),
            frozenset(expect),
            mentions,
            owner,
            INTERNALS,
        )
    for position in (0, 3, 7):

        def batch(at: int = position) -> list[tuple[str, tuple[str, bytes, str]]]:
            files = [("file", (f"f{i}.jpg", good_jpeg(), "image/jpeg")) for i in range(8)]
            files[at] = ("file", ("bomb.png", png(8000, 1), "image/png"))
            return files

        yield Hostile(
            f"{f}/classify/batch-of-8-bomb-at-{position}",
            f,
            HttpAttempt("POST", "/v1/classify", files=batch),
            frozenset({400}),
            ("image", "file"),
            SERVING,
            INTERNALS,
        )


def upload_cases() -> Iterator[Hostile]:
    f = "upload-multipart"

    def files(
        n: int, data: Callable[[], bytes] = good_jpeg
    ) -> Callable[[], list[tuple[str, tuple[str, bytes, str]]]]:
        return lambda: [("file", (f"f{i}.jpg", data(), "image/jpeg")) for i in range(n)]

    yield Hostile(
        f"{f}/files-9",
        f,
        HttpAttempt("POST", "/v1/classify", files=files(9)),
        frozenset({400}),
        ("file",),
    )
    yield Hostile(
        f"{f}/files-2000",
        f,
        HttpAttempt("POST", "/v1/classify", files=files(2000, lambda: b"\xff\xd8\xff")),
        frozenset({400}),
        ("file",),
    )
    yield Hostile(
        f"{f}/file-empty",
        f,
        HttpAttempt("POST", "/v1/classify", files=files(1, lambda: b"")),
        frozenset({400}),
        ("file",),
    )
    yield Hostile(
        f"{f}/file-5MB",
        f,
        HttpAttempt(
            "POST", "/v1/classify", files=files(1, lambda: b"\xff\xd8\xff" + b"\0" * (5 << 20))
        ),
        frozenset({413}),
        ("limit",),
    )
    yield Hostile(
        f"{f}/wrong-field",
        f,
        HttpAttempt(
            "POST", "/v1/classify", files=lambda: [("image", ("a.jpg", good_jpeg(), "image/jpeg"))]
        ),
        frozenset({400, 422}),
        ("file",),
    )
    multipart = {"Content-Type": "multipart/form-data; boundary=XyZ"}
    for label, body in (
        ("no-boundary-in-body", b"just bytes, no parts"),
        (
            "unterminated-part",
            b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\n\r\n\xff\xd8\xff',
        ),
        (
            "fields-5000",
            b"".join(
                b'--XyZ\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i
                for i in range(5000)
            )
            + b"--XyZ--\r\n",
        ),
        (
            "part-header-64KB",
            b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="'
            + b"n" * 65536
            + b'"\r\n\r\n\xff\xd8\xff\r\n--XyZ--\r\n',
        ),
        ("part-without-disposition", b"--XyZ\r\nContent-Type: image/png\r\n\r\nxx\r\n--XyZ--\r\n"),
    ):
        yield Hostile(
            f"{f}/{label}",
            f,
            HttpAttempt("POST", "/v1/classify", raw_body(body), multipart),
            frozenset({400, 422}),
            (),
        )
    yield Hostile(
        f"{f}/multipart-no-boundary",
        f,
        HttpAttempt(
            "POST", "/v1/classify", raw_body(b"x"), {"Content-Type": "multipart/form-data"}
        ),
        frozenset({400, 422}),
        (),
    )
    yield Hostile(
        f"{f}/json-instead",
        f,
        HttpAttempt(
            "POST", "/v1/classify", raw_body(b'{"file": "x"}'), {"Content-Type": "application/json"}
        ),
        frozenset({400, 422}),
        (),
    )
