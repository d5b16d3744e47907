"""Cut the ``nvidia-pytriton`` wheel down to what the embedded Triton needs for one Python version.

The wheel is 55 MB because it carries a Python backend stub for every Python from 3.8 to 3.13 and
a bundled ``libpython3.13`` (31 MB) for the 3.13 stub. A GPU box that runs Python 3.12 needs the
server binary, ``libtritonserver``, the Python backend, the 3.12 stub and the libraries they link.
The slim archive also replaces ``pytriton/__init__.py`` with an empty module: the launcher only
needs the package's location, and the real ``__init__`` imports PyTriton's client (tritonclient's
HTTP extras, pyzmq, sh) which the GPU image does not have.

    python -m loadtest._slim_pytriton .whl/nvidia_pytriton-0.7.0-*.whl 3.12 .whl/pytriton-slim-py312.zip

The result is a plain zip to unpack into a ``site-packages`` (``--target``) folder, not a wheel.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

__all__ = ["slim"]


def _keep(name: str, python: str) -> bool:
    if name.startswith("pytriton/tritonserver/"):
        rest = name.removeprefix("pytriton/tritonserver/")
        if rest.startswith("python_backend_stubs/"):
            return rest.startswith(f"python_backend_stubs/{python}/")
        return rest.startswith(("bin/", "backends/python/", "caches/"))
    if name.startswith("nvidia_pytriton.libs/"):
        return "libpython3" not in name  # only the 3.13 stub links the bundled libpython
    return False


def slim(wheel: Path, python: str, target: Path) -> Path:
    """Write ``target``: the server parts of ``wheel`` for Python ``python`` (e.g. ``"3.12"``)."""
    # LZMA, not deflate: the ICU data library alone is 29 MB and deflates to 12 (39 MB in all, over what
    # a transfer to a GPU host allows beside the other wheels); LZMA makes the archive 27 MB.
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_LZMA) as out:
        for info in source.infolist():
            if _keep(info.filename, python):
                out.writestr(info, source.read(info), compress_type=zipfile.ZIP_LZMA)
        out.writestr(
            "pytriton/__init__.py", '"""Server files of nvidia-pytriton 0.7.0 only (slimmed)."""\n'
        )
    return target


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    print(slim(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))
