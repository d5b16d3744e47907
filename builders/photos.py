"""Real photographs that ship inside installed packages, split once into calibration and held-out sets.

Nothing is downloaded: every photograph is a file inside a wheel the builders already install
(scikit-image's ``skimage/data``, scikit-learn's ``sklearn/datasets/images``, matplotlib's
``mpl-data/sample_data``). The split is fixed here, by kind of picture rather than by any result, so
that each side holds objects, textures and scientific images:

- :data:`CALIBRATION_PHOTOS` calibrate INT8 and check FP32/FP16 parity; :func:`calibration_views`
  multiplies them by deterministic crops and mirror images (calibration wants many activation
  statistics, and a crop is a new one).
- :data:`HELD_OUT_PHOTOS` are never calibrated on: a precision variant is judged on them, whole
  and untouched, and they are the promotion gate's golden set (:mod:`builders.golden`). Where a correct
  ImageNet classifier has an unambiguous answer, the photo carries the classes accepted as top-1.

Stereo pairs (``motorcycle_left``/``right``) stay on one side: they are one scene.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from PIL import Image

__all__ = [
    "CALIBRATION_PHOTOS",
    "CALIBRATION_VIEWS",
    "HELD_OUT_PHOTOS",
    "Photo",
    "View",
    "calibration_views",
    "photo_files",
]


@dataclass(frozen=True)
class Photo:
    """One photograph shipped in a package.

    Attributes:
        name: short name, unique across both sets.
        module: the importable package that ships it.
        path: the file, relative to that package's folder.
        labels: ImageNet classes a correct classifier may put on top (empty: no single right answer).
    """

    name: str
    module: str
    path: str
    labels: frozenset[int] = frozenset()

    def file(self) -> Path:
        """The photograph's file (found without importing the package).

        Raises:
            FileNotFoundError: the package or the file is not installed.
        """
        spec = importlib.util.find_spec(self.module)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            candidate = Path(folder) / self.path
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"photograph '{self.name}' ({self.module}/{self.path}) is not installed; "
            "install the builders extra"
        )

    def load(self) -> Image.Image:
        """The photograph as RGB (grey-level photographs are repeated over the three channels)."""
        with Image.open(self.file()) as image:
            return image.convert("RGB")


def _skimage(name: str, suffix: str = "png", labels: frozenset[int] = frozenset()) -> Photo:
    return Photo(name, "skimage", f"data/{name}.{suffix}", labels)


_CATS = frozenset(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat

#: never calibrated on; verified labels where a correct classifier has one answer
HELD_OUT_PHOTOS: tuple[Photo, ...] = (
    _skimage("chelsea", labels=_CATS),
    _skimage(
        "coffee", labels=frozenset({504, 550, 967, 968})
    ),  # coffee mug, espresso maker, espresso, cup
    _skimage("camera", labels=frozenset({759, 872})),  # a man behind a reflex camera on a tripod
    _skimage(
        "rocket", "jpg", labels=frozenset({657, 744, 812})
    ),  # missile, projectile, space shuttle
    Photo(
        "china", "sklearn", "datasets/images/china.jpg", frozenset({663, 698})
    ),  # monastery, palace
    _skimage("astronaut"),
    _skimage("brick"),
    _skimage("coins"),
    _skimage("moon"),
    _skimage("hubble_deep_field", "jpg"),
    _skimage("retina", "jpg"),
    _skimage("text"),
)

#: calibration only (with their crops and mirror images)
CALIBRATION_PHOTOS: tuple[Photo, ...] = (
    _skimage("motorcycle_left"),
    _skimage("motorcycle_right"),
    Photo("flower", "sklearn", "datasets/images/flower.jpg"),
    Photo("grace_hopper", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    _skimage("grass"),
    _skimage("gravel"),
    _skimage("clock_motion"),
    _skimage("ihc"),
    _skimage("cell"),
    _skimage("microaneurysms"),
    _skimage("page"),
)


@dataclass(frozen=True)
class View:
    """A deterministic crop of a photograph: ``scale`` of each side, placed at (``x``, ``y``) in [0, 1]
    of the free room, optionally mirrored."""

    name: str
    scale: float
    x: float = 0.5
    y: float = 0.5
    mirrored: bool = False

    def apply(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        w, h = max(1, round(width * self.scale)), max(1, round(height * self.scale))
        left, top = round((width - w) * self.x), round((height - h) * self.y)
        view = image.crop((left, top, left + w, top + h)) if self.scale < 1 else image
        return view.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if self.mirrored else view


#: eight views per calibration photograph (11 photographs: 88 calibration images, a multiple of 4 and 8)
CALIBRATION_VIEWS: tuple[View, ...] = (
    View("whole", 1.0),
    View("mirrored", 1.0, mirrored=True),
    View("top-left", 0.6, 0.0, 0.0),
    View("top-right", 0.6, 1.0, 0.0, mirrored=True),
    View("bottom-left", 0.6, 0.0, 1.0, mirrored=True),
    View("bottom-right", 0.6, 1.0, 1.0),
    View("centre", 0.6),
    View("centre-wide", 0.8, mirrored=True),
)


@cache
def _loaded(photo: Photo) -> Image.Image:
    return photo.load()


def calibration_views(views: tuple[View, ...] = CALIBRATION_VIEWS) -> list[tuple[str, Image.Image]]:
    """``(name, image)`` for every calibration photograph under every view, in a fixed order."""
    return [
        (f"{photo.name}/{view.name}", view.apply(_loaded(photo)))
        for photo in CALIBRATION_PHOTOS
        for view in views
    ]


def photo_files() -> list[Path]:
    """Every photograph's file and this module: what a build that uses them depends on."""
    return [Path(__file__), *(p.file() for p in (*CALIBRATION_PHOTOS, *HELD_OUT_PHOTOS))]
