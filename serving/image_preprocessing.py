"""Image preprocessing, defined once: encoded bytes -> a normalised CHW float32 tensor.

Used by the Triton Python model ``image_preprocess`` (the build copies this file beside its
``model.py`` and hashes it into every build that depends on it), by the builders' samples and the
promotion golden set, so what a classifier is verified and calibrated on is exactly what it sees in
production, and by the GPU pipeline (``serving/gpu_images.py``) for its parameters and header
limits. It needs only numpy and Pillow: the serving host may have nothing else.

Decoding cannot blow up: the source size, the aspect ratio and the resize target are checked from the
image's header, before anything of that size is allocated (Pillow decodes lazily but ``resize``
allocates its target: a 104-byte 8000x1 PNG resized to a short side of 256 would be 2 GB). Every
problem is an :class:`ImageError` whose message names it in words of its own: no library message,
path or traceback.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

__all__ = [
    "DecodeLimits",
    "ImageError",
    "Preprocessing",
    "check_size",
    "decode",
    "preprocess",
    "preprocess_bytes",
    "resized_size",
]


class ImageError(ValueError):
    """An image this preprocessing refuses; the message is safe to send back to a client."""


@dataclass(frozen=True)
class Preprocessing:
    """Resize the short side to ``resize``, centre-crop ``size`` x ``size``, then ``(x - mean) / std``."""

    size: int = 224
    resize: int = 256
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    def parameters(self) -> dict[str, str]:
        """As Triton config parameters (what :meth:`from_parameters` reads back)."""
        return {
            "size": str(self.size),
            "resize": str(self.resize),
            "mean": ",".join(str(v) for v in self.mean),
            "std": ",".join(str(v) for v in self.std),
        }

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> Preprocessing:
        def floats(raw: str) -> tuple[float, float, float]:
            a, b, c = (float(v) for v in raw.split(","))
            return a, b, c

        default = cls()
        return cls(
            size=int(params.get("size", default.size)),
            resize=int(params.get("resize", default.resize)),
            mean=floats(params["mean"]) if "mean" in params else default.mean,
            std=floats(params["std"]) if "std" in params else default.std,
        )


@dataclass(frozen=True)
class DecodeLimits:
    """What an image may be, checked from its header before it is decoded (``serving.limits`` holds
    the platform's values; the build writes them into the model config)."""

    max_source_pixels: int = 25_000_000
    max_aspect_ratio: float = 20.0
    max_resized_pixels: int = 4_000_000

    def parameters(self) -> dict[str, str]:
        return {
            "max_source_pixels": str(self.max_source_pixels),
            "max_aspect_ratio": str(self.max_aspect_ratio),
            "max_resized_pixels": str(self.max_resized_pixels),
        }

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> DecodeLimits:
        default = cls()
        return cls(
            max_source_pixels=int(params.get("max_source_pixels", default.max_source_pixels)),
            max_aspect_ratio=float(params.get("max_aspect_ratio", default.max_aspect_ratio)),
            max_resized_pixels=int(params.get("max_resized_pixels", default.max_resized_pixels)),
        )


def resized_size(width: int, height: int, spec: Preprocessing) -> tuple[int, int]:
    """The resize target of a ``width`` x ``height`` image: short side ``resize``, never below ``size``."""
    scale = spec.resize / min(width, height)
    return max(spec.size, round(width * scale)), max(spec.size, round(height * scale))


def check_size(width: int, height: int, spec: Preprocessing, limits: DecodeLimits) -> None:
    """Refuse a ``width`` x ``height`` image (read from its header) over ``limits``, before decoding it.

    Raises:
        ImageError: no pixels, too many, too elongated, or a resize target over the limit.
    """
    if width < 1 or height < 1:
        raise ImageError(f"image has no pixels ({width}x{height})")
    if width * height > limits.max_source_pixels:
        raise ImageError(
            f"image of {width}x{height} pixels is larger than {limits.max_source_pixels} pixels"
        )
    if max(width, height) / min(width, height) > limits.max_aspect_ratio:
        raise ImageError(
            f"image of {width}x{height} pixels has an aspect ratio above {limits.max_aspect_ratio:g}"
        )
    target_w, target_h = resized_size(width, height, spec)
    if target_w * target_h > limits.max_resized_pixels:
        raise ImageError(
            f"image of {width}x{height} pixels would be resized to {target_w}x{target_h}, "
            f"more than {limits.max_resized_pixels} pixels"
        )


def _to_rgb(image: Image.Image) -> Image.Image:
    """Any mode as 8-bit RGB; 16-bit grey is scaled down rather than clipped to white."""
    if image.mode.startswith("I") or image.mode == "F":
        array = np.asarray(image, dtype=np.float32)
        peak = float(array.max(initial=0))
        if image.mode == "F":
            scale = 255.0 if peak <= 1.0 else 1.0
        else:
            scale = 255.0 / 65535.0 if peak > 255 else 1.0
        image = Image.fromarray(np.clip(array * scale, 0, 255).astype(np.uint8), mode="L")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode(
    data: bytes, spec: Preprocessing = Preprocessing(), limits: DecodeLimits = DecodeLimits()
) -> Image.Image:
    """Encoded bytes -> an upright RGB image, refusing anything over ``limits`` before decoding it.

    Raises:
        ImageError: not an image Pillow can read, truncated or corrupt, or over a limit.
    """
    try:
        with warnings.catch_warnings():
            # Pillow's own decompression-bomb warning: the limits below are stricter and checked first.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            width, height = image.size
    except Image.DecompressionBombError:  # Pillow's own cap (far above ours) refused the header
        raise ImageError(f"image is larger than {limits.max_source_pixels} pixels") from None
    except Exception:  # Pillow raises many types for foreign bytes
        raise ImageError("input is not a decodable image (JPEG, PNG, ...)") from None
    check_size(width, height, spec, limits)
    try:
        image.load()
    except Exception:  # truncated data, a broken chunk, a decoder error
        raise ImageError("image data is truncated or corrupt") from None
    try:
        # EXIF orientation: a photo taken upright is classified upright (the sides may swap).
        image = ImageOps.exif_transpose(image) or image
    except Exception:  # an unreadable EXIF block: keep the pixels as stored
        pass
    try:
        return _to_rgb(image)
    except Exception:
        raise ImageError(f"image pixel format {image.mode} cannot be converted to RGB") from None


def preprocess(
    image: Image.Image, spec: Preprocessing = Preprocessing(), limits: DecodeLimits = DecodeLimits()
) -> np.ndarray:
    """An image -> float32 [3, size, size]: resize (short side), centre-crop, normalise.

    Raises:
        ImageError: the image is over ``limits`` (checked before resizing).
    """
    check_size(image.width, image.height, spec, limits)
    image = _to_rgb(image)
    target = resized_size(image.width, image.height, spec)
    image = image.resize(target, Image.Resampling.BILINEAR)
    left, top = (image.width - spec.size) // 2, (image.height - spec.size) // 2
    image = image.crop((left, top, left + spec.size, top + spec.size))
    array = np.asarray(image, dtype=np.float32) / 255.0
    array = (array - np.asarray(spec.mean, dtype=np.float32)) / np.asarray(
        spec.std, dtype=np.float32
    )
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def preprocess_bytes(
    data: bytes, spec: Preprocessing = Preprocessing(), limits: DecodeLimits = DecodeLimits()
) -> np.ndarray:
    """Encoded bytes -> float32 [3, size, size] (:func:`decode` then :func:`preprocess`)."""
    return preprocess(decode(data, spec, limits), spec, limits)
