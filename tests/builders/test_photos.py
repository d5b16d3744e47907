"""The packaged photographs: installed, calibration and held-out sets disjoint, views deterministic."""

from __future__ import annotations

import hashlib

import numpy as np

from builders.golden import golden_set, held_out_batch
from builders.photos import (
    CALIBRATION_PHOTOS,
    CALIBRATION_VIEWS,
    HELD_OUT_PHOTOS,
    calibration_views,
    photo_files,
)
from serving.image_preprocessing import Preprocessing


def _digest(image) -> str:  # type: ignore[no-untyped-def]
    return hashlib.sha256(np.asarray(image).tobytes()).hexdigest()


def test_every_photograph_is_installed_and_the_sets_are_disjoint() -> None:
    files = photo_files()
    assert all(path.is_file() for path in files)
    calibration = {p.name for p in CALIBRATION_PHOTOS}
    held_out = {p.name for p in HELD_OUT_PHOTOS}
    assert not calibration & held_out
    assert len(calibration) == len(CALIBRATION_PHOTOS) and len(held_out) == len(HELD_OUT_PHOTOS)
    # Disjoint by content too: no held-out photograph is a file or an image of the calibration side.
    assert not {p.file() for p in CALIBRATION_PHOTOS} & {p.file() for p in HELD_OUT_PHOTOS}
    seen = {_digest(image) for _, image in calibration_views()}
    assert not seen & {_digest(p.load()) for p in HELD_OUT_PHOTOS}


def test_calibration_views_are_deterministic_and_distinct() -> None:
    first = calibration_views()
    assert len(first) == len(CALIBRATION_PHOTOS) * len(CALIBRATION_VIEWS)
    assert [_digest(image) for _, image in first] == [
        _digest(image) for _, image in calibration_views()
    ]
    assert len({_digest(image) for _, image in first}) == len(first)


def test_golden_set_is_the_held_out_photographs_with_their_labels() -> None:
    items = golden_set(Preprocessing())
    assert [item.name for item in items] == [p.name for p in HELD_OUT_PHOTOS]
    assert {item.name for item in items if item.accepted} >= {"chelsea", "coffee"}
    batch = held_out_batch(Preprocessing(size=160, resize=180))
    assert batch.shape == (len(HELD_OUT_PHOTOS), 3, 160, 160) and batch.dtype == np.float32
