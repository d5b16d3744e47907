"""The one preprocessing definition (``serving/image_preprocessing.py``), alone: limits checked from
the header before any large allocation, every problem named in words of its own, unusual encodings of
real photographs read as the photographs they are."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from serving.image_preprocessing import (
    DecodeLimits,
    ImageError,
    Preprocessing,
    decode,
    preprocess,
    preprocess_bytes,
)
from tests.support.images import AWKWARD, HOSTILE, encode, photo, png_header_only

#: what a library or the interpreter says; none of it may reach a client
LIBRARY_WORDS = ("PIL", "Traceback", ".py", "cannot identify", "broken data stream", "Errno")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_images_are_refused_by_name(name: str) -> None:
    make, words = HOSTILE[name]
    payload = make()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ImageError, match=words) as info:
        preprocess_bytes(payload)
    assert not [w for w in LIBRARY_WORDS if w in str(info.value)], str(info.value)
    # Refused before decoding: the process did not grow by anything like the declared image.
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert grown_kib < 200 * 1024, f"{name}: peak RSS grew by {grown_kib} KiB"


def test_the_resize_target_is_bounded_before_resizing() -> None:
    limits = DecodeLimits(max_resized_pixels=100_000)
    # 1000x500 is allowed as a source, but its resize target (512x256) is not.
    with pytest.raises(ImageError, match="resized to 512x256"):
        decode(png_header_only(1000, 500), Preprocessing(), limits)
    with pytest.raises(ImageError, match="resized"):
        preprocess(photo("chelsea").resize((1000, 500)), Preprocessing(), limits)


@pytest.mark.parametrize("name", sorted(AWKWARD))
def test_unusual_encodings_read_as_the_photograph(name: str) -> None:
    source, make = AWKWARD[name]
    got = preprocess_bytes(make())
    assert got.shape == (3, 224, 224) and got.dtype == np.float32
    # Compared as grey levels: CMYK, palettes and 16-bit grey change colours a little, not the picture.
    expected = preprocess(photo(source)).mean(axis=0)
    correlation = np.corrcoef(got.mean(axis=0).ravel(), expected.ravel())[0, 1]
    assert correlation > 0.97, f"{name}: correlation {correlation:.3f} with the original photograph"


def test_exif_orientation_is_applied() -> None:
    _, make = AWKWARD["exif-rotated jpeg"]
    assert decode(make()).size == photo("chelsea").size


def test_parameters_round_trip() -> None:
    spec = Preprocessing(
        size=200, resize=230, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
    )
    limits = DecodeLimits(max_source_pixels=10, max_aspect_ratio=2.5, max_resized_pixels=20)
    assert Preprocessing.from_parameters(spec.parameters()) == spec
    assert DecodeLimits.from_parameters(limits.parameters()) == limits


def test_bytes_and_images_give_the_same_tensor() -> None:
    image = photo("coffee")
    np.testing.assert_array_equal(preprocess_bytes(encode(image)), preprocess(image))
