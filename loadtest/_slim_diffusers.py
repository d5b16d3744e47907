"""diffusers' wheel cut to what the GPU diffusion benchmark imports, so it travels in a few MB.

    python -m loadtest._slim_diffusers diffusers-0.42.1-py3-none-any.whl diffusers-slim.zip

Kept: the package but for its other pipelines' folders (``diffusers/pipelines/<name>/`` other than
``stable_diffusion``) and the modular pipelines, which ``StableDiffusionPipeline``, the models and
the schedulers never import (diffusers imports its pipelines lazily, by name); the dist-info, so
``importlib.metadata`` knows the version. The result is a zip to extract onto ``sys.path`` (a wheel
missing files would fail its RECORD). ``loadtest/diffusion_gpu.sh`` extracts every ``*.zip`` of its
wheels folder.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

__all__ = ["slim"]

#: the one pipeline folder the benchmark uses
_PIPELINES = ("stable_diffusion",)


def _keep(name: str) -> bool:
    parts = name.split("/")
    if parts[0] != "diffusers":
        return True  # the dist-info
    if len(parts) > 1 and parts[1] == "modular_pipelines":
        return False
    if len(parts) > 3 and parts[1] == "pipelines":
        return parts[2] in _PIPELINES
    return True


def slim(wheel: Path, target: Path) -> Path:
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_LZMA) as out:
        for item in source.infolist():
            if _keep(item.filename):
                out.writestr(item, source.read(item))
    return target


if __name__ == "__main__":
    made = slim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{made}: {made.stat().st_size / 1e6:.1f} MB")
