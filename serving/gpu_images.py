"""Encoded images -> one normalised batch on the GPU: header checks, nvJPEG batch decode, resize,
centre crop, normalise.

The GPU twin of the CPU preprocessing (``serving/image_preprocessing.py``, whose parameters, limits,
header checks and errors it uses), with the same arithmetic: the short side is resized to ``resize``
with a bilinear filter that antialiases when it shrinks (what PIL's ``BILINEAR`` does), the result
is rounded to 8 bits as PIL's is, the centre ``size`` x ``size`` is cropped and
``(x / 255 - mean) / std`` is applied.

- Every image's header is read before anything is decoded (pure Python, a few microseconds): an
  image that is not JPEG/PNG/GIF/BMP/WebP, that declares more than ``max_source_pixels`` pixels, or
  whose aspect ratio would make the resized image huge, is refused without a single allocation.
- JPEGs (grey or colour) are decoded together in one ``torchvision.io.decode_jpeg(list,
  device="cuda")`` call; if that batch call fails, each image is retried alone, then on the CPU, so
  one corrupt file fails only itself. Other formats are decoded on the CPU (Pillow) and copied over.
- Images of one size are resized together; the batch is written straight into the caller's tensor
  (for the serving model: the static input of a captured CUDA graph).

Needs torch (torchvision when present) and Pillow: the builders copy this file and the shared
preprocessing module beside the GPU pipeline model, which imports them as sibling modules.
"""

from __future__ import annotations

import ctypes
import io
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # beside a Triton model: the copy of the shared module that the build hashed
    from image_preprocessing import (
        DecodeLimits,
        ImageError,
        Preprocessing,
        check_size,
        resized_size,
    )
except ImportError:  # imported from the source tree
    from serving.image_preprocessing import (
        DecodeLimits,
        ImageError,
        Preprocessing,
        check_size,
        resized_size,
    )

__all__ = [
    "DEFAULT_CHUNK",
    "DecodeLimits",
    "DecodedImages",
    "ImageError",
    "ImageHeader",
    "Preprocessing",
    "decode",
    "decode_chunks",
    "preprocess_into",
    "read_header",
]

#: images per chunk where a caller overlaps decode with the GPU work of the chunk before
#: (``decode_chunks``; ``image_classifier_gpu``'s ``pipeline_chunk``, off by default there: on the
#: H200 the whole batch at once was faster)
DEFAULT_CHUNK = 32

#: decoded pixels held on the GPU at once (a batch of large photos is decoded in slices)
MAX_BATCH_PIXELS = 256_000_000

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PNG = b"\x89PNG\r\n\x1a\n"


_DEFAULT_LIMITS = DecodeLimits()


@dataclass(frozen=True)
class ImageHeader:
    format: str  # "jpeg", "png" or "other"
    width: int
    height: int
    gpu: bool  # decodable by nvJPEG (a greyscale or 3-channel JPEG)


def host_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous host uint8 tensor, without a copy (and without numpy)."""
    if tensor.is_cuda or tensor.dtype != torch.uint8 or not tensor.is_contiguous():
        raise ValueError("expected a contiguous host uint8 tensor")
    n = tensor.numel()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * n).from_address(tensor.data_ptr())).cast("B")


def _jpeg_header(data: memoryview) -> ImageHeader:
    n, i = len(data), 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise ImageError("corrupt JPEG: a segment does not start with a marker")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            raise ImageError("corrupt JPEG: a segment length is below 2")
        if marker in _SOF:
            if i + 10 > n:
                break
            height, width = (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
            components = data[i + 9]
            # nvJPEG gets only whole files: a truncated one goes to the host's decoder, which
            # refuses it by name (the overlapped way hung on one on the GPU: benchmarks/h200/run11).
            return ImageHeader("jpeg", width, height, gpu=components in (1, 3) and _whole(data))
        if marker in (0xDA, 0xD9):  # scan data or the end before any frame header
            break
        i += 2 + length
    raise ImageError("corrupt JPEG: no frame header")


def _whole(data: memoryview) -> bool:
    """Whether a JPEG ends with its end-of-image marker (after the zero padding a row of a batch of
    differently sized images carries)."""
    end = len(data)
    if end and data[end - 1] == 0:  # padded: one copy of the file to strip it
        end = len(bytes(data).rstrip(b"\0"))
    return end >= 2 and data[end - 2] == 0xFF and data[end - 1] == 0xD9


def read_header(
    data: memoryview, p: Preprocessing, limits: DecodeLimits = _DEFAULT_LIMITS
) -> ImageHeader:
    """Format and size from the header alone; :class:`ImageError` for anything not to decode."""
    if len(data) >= 4 and data[0] == 0xFF and data[1] == 0xD8 and data[2] == 0xFF:
        header = _jpeg_header(data)
    elif len(data) >= 24 and bytes(data[:8]) == _PNG and bytes(data[12:16]) == b"IHDR":
        width = int.from_bytes(data[16:20], "big")
        height = int.from_bytes(data[20:24], "big")
        header = ImageHeader("png", width, height, gpu=False)
    else:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as image:  # reads the header only
                header = ImageHeader("other", image.width, image.height, gpu=False)
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
            raise ImageError("input is not a decodable image (JPEG/PNG/GIF/BMP/WebP)") from exc
    check_size(header.width, header.height, p, limits)
    return header


@dataclass
class DecodedImages:
    """``images[i]`` is a ``[3, H, W]`` uint8 tensor on the device, or ``None`` where ``errors[i]``
    says why."""

    images: list[torch.Tensor | None]
    errors: list[str | None]


def _decode_cpu(data: memoryview) -> torch.Tensor:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError("input is not a decodable image (JPEG/PNG/GIF/BMP/WebP)") from exc
    pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    return pixels.view(rgb.height, rgb.width, 3).permute(2, 0, 1)


def _nvjpeg() -> object | None:
    try:
        import torchvision.io
    except ImportError:
        return None
    return torchvision.io


def decode(
    encoded: Sequence[torch.Tensor], headers: Sequence[ImageHeader], device: torch.device
) -> DecodedImages:
    """Decode host uint8 tensors (each one encoded image; trailing padding after the image's end
    is ignored, as every decoder does) to ``[3, H, W]`` uint8 tensors on ``device``."""
    out = DecodedImages([None] * len(encoded), [None] * len(encoded))
    tvio = _nvjpeg() if device.type == "cuda" else None
    on_gpu = [i for i, h in enumerate(headers) if h.gpu and tvio is not None]
    start = 0
    while start < len(on_gpu):  # slices of at most MAX_BATCH_PIXELS decoded pixels
        stop, pixels = start, 0
        while stop < len(on_gpu) and (
            stop == start
            or pixels + headers[on_gpu[stop]].width * headers[on_gpu[stop]].height
            <= MAX_BATCH_PIXELS
        ):
            pixels += headers[on_gpu[stop]].width * headers[on_gpu[stop]].height
            stop += 1
        chunk = on_gpu[start:stop]
        try:
            decoded = tvio.decode_jpeg(  # type: ignore[attr-defined]
                [encoded[i] for i in chunk],
                mode=tvio.ImageReadMode.RGB,  # type: ignore[attr-defined]
                device=device,
            )
            for i, image in zip(chunk, decoded, strict=True):
                out.images[i] = image
        except Exception:  # one bad file fails the batch call: find it by decoding alone
            for i in chunk:
                try:
                    out.images[i] = tvio.decode_jpeg(  # type: ignore[attr-defined]
                        encoded[i],
                        mode=tvio.ImageReadMode.RGB,  # type: ignore[attr-defined]
                        device=device,
                    )
                except Exception:
                    pass  # left to the CPU below, which says what is wrong with it
        start = stop
    for i, header in enumerate(headers):
        if out.images[i] is None:
            try:
                image = _decode_cpu(host_bytes(encoded[i]))
                if (image.shape[2], image.shape[1]) != (header.width, header.height):
                    raise ImageError("the image's header and its pixels disagree on its size")
                out.images[i] = image.to(device, non_blocking=True)
            except ImageError as exc:
                out.errors[i] = str(exc)
    return out


def _on_device(
    values: Sequence[float] | Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A small constant on ``device`` without stalling the host: ``torch.tensor(..., device="cuda")``
    copies from pageable memory and waits for the stream, which would serialise the host with the
    GPU once per call; from pinned memory the copy is queued like a kernel."""
    host = torch.tensor(values, dtype=dtype)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def decode_chunks(
    encoded: Sequence[torch.Tensor],
    headers: Sequence[ImageHeader],
    device: torch.device,
    chunk: int,
    skip: Callable[[int], bool] = lambda i: False,
) -> Iterator[tuple[list[int], DecodedImages]]:
    """:func:`decode` in chunks of ``chunk`` images: yields each chunk's image indices (those not
    ``skip``-ped at the time) and their decoded images. nvJPEG blocks the host until its chunk is
    decoded, so whatever the caller queued on the GPU between two chunks runs meanwhile: the
    pipeline's overlap."""
    for start in range(0, len(encoded), max(1, chunk)):
        live = [i for i in range(start, min(start + max(1, chunk), len(encoded))) if not skip(i)]
        if live:
            yield live, decode([encoded[i] for i in live], [headers[i] for i in live], device)


def preprocess_into(images: Sequence[torch.Tensor], out: torch.Tensor, p: Preprocessing) -> None:
    """Resize, crop and normalise ``[3, H, W]`` uint8 images into ``out[:len(images)]``
    (``[n, 3, size, size]``, any float dtype, on the images' device). Only queues work on the current
    stream: nothing here waits for the GPU.

    The host's time here is kernel launches, about a dozen per distinct image size: each size's
    images are resized and rounded together and written to their rows as whole pixel levels (exact
    in FP16), and the normalisation runs once over all the rows."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        groups[(int(image.shape[1]), int(image.shape[2]))].append(i)
    for (height, width), members in groups.items():
        batch = torch.stack([images[i] for i in members]).to(torch.float32)
        new_w, new_h = resized_size(width, height, p)
        # As Pillow does it: the horizontal pass, rounded to 8 bits, then the vertical pass, rounded
        # again (half up). Resizing both axes at once in float differs by one level on ~18% of the
        # pixels, which is enough to swap two near-tied classes of a sample photo. (No clamp: the
        # filter's weights are positive and sum to one, so the result stays within 0..255 but for
        # float error, which the rounding absorbs.)
        if new_w != width:
            batch = F.interpolate(
                batch, size=(height, new_w), mode="bilinear", antialias=True, align_corners=False
            )
            batch = batch.add_(0.5).floor_()
        if new_h != height:
            batch = F.interpolate(
                batch, size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False
            )
            batch = batch.add_(0.5).floor_()
        top, left = (new_h - p.size) // 2, (new_w - p.size) // 2
        batch = batch[:, :, top : top + p.size, left : left + p.size]
        if members[-1] - members[0] + 1 == len(members):  # consecutive rows: a plain copy
            out[members[0] : members[-1] + 1].copy_(batch)
        else:
            out.index_copy_(0, _on_device(members, torch.long, out.device), batch.to(out.dtype))
    # (x / 255 - mean) / std as one multiply-add over every row, computed in FP32 (PyTorch's
    # arithmetic type for FP16) and rounded once into ``out``.
    scale = _on_device([1.0 / (255.0 * s) for s in p.std], torch.float32, out.device).view(
        1, 3, 1, 1
    )
    shift = _on_device(
        [-m / s for m, s in zip(p.mean, p.std, strict=True)], torch.float32, out.device
    ).view(1, 3, 1, 1)
    rows = out[: len(images)]
    torch.addcmul(shift, rows, scale, out=rows)
