"""What a GPU host without network gets from carried wheel folders (``.whl/<name>/``).

Used by the GPU steps of ``loadtest/gpu_bench.sh all`` that need more than the host has:

- :func:`one`: the single file of a pack matching a pattern, or a message naming how to make it;
- :func:`unpack_onto_path`: a pure-Python wheel (or a cut-down zip) unpacked into a private folder that is
  put first on this process's path and on ``PYTHONPATH``, so child processes (a baseline server)
  import it too; Triton's Python stub ignores ``PYTHONPATH``: pass the folder to
  :func:`numpy1_interpreter` (``also``) for its models;
- :func:`numpy1_interpreter`: Triton 2.51's Python stub cannot take string tensors (texts, prompts)
  under numpy 2; Triton's Python models then get an interpreter of their own (a virtual environment:
  numpy 1.26 from the pack, then this host's site-packages) while this process keeps numpy 2.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["numpy1_interpreter", "one", "unpack_onto_path"]


def one(pack: Path, pattern: str, how: str = "loadtest/gpu_bench.sh prepare") -> Path:
    """The newest file of ``pack`` matching ``pattern``.

    Raises:
        SystemExit: none matches (the message says what makes the pack).
    """
    found = sorted(pack.glob(pattern))
    if not found:
        raise SystemExit(f"{pack}/{pattern} is missing: run {how}")
    return found[-1]


def unpack_onto_path(archive: Path, folder: Path) -> None:
    """Unpack ``archive`` into ``folder``, importable here and in every child process started after."""
    zipfile.ZipFile(archive).extractall(folder)
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(folder), os.environ.get("PYTHONPATH")])
    )


def numpy1_interpreter(
    pack: Path,
    work: Path,
    check: str = "torch",
    also: Sequence[Path] = (),
    hide: Sequence[str] = (),
) -> str | None:
    """An interpreter for Triton's Python models with numpy 1.x (``None``: this one already has it).

    ``check`` names modules (comma separated) the models import, tried in the new interpreter;
    ``also``: folders put on its path before this host's packages (Triton's Python stub ignores
    ``PYTHONPATH``); ``hide``: host packages built for numpy 2 that the models
    only reach through optional imports (transformers imports scikit-learn, and so SciPy, where
    they are installed): made unimportable there, so the optional paths are skipped.
    """
    import numpy

    if int(numpy.__version__.split(".")[0]) < 2:
        return None
    env = work / "stub-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python3"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    zipfile.ZipFile(one(pack, "numpy-1.*.whl")).extractall(purelib)
    # After numpy 1.26: this interpreter's own packages (torch, tokenizers), .pth files included.
    host = [*(str(p) for p in also), *site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    lines = [
        f"import site; site.addsitedir({p!r})" for p in dict.fromkeys(host) if Path(p).is_dir()
    ]
    if hide:  # a None entry in sys.modules: import fails and importlib.util.find_spec answers None
        lines.append(f"import sys; sys.modules.update(dict.fromkeys({tuple(hide)!r}))")
    (purelib / "zz-host-packages.pth").write_text("\n".join(lines) + "\n")
    modules = ", ".join(["numpy", *check.split(",")])
    probe = subprocess.run(
        [str(python), "-c", f"import {modules}; print('Python models: numpy', numpy.__version__)"],
        capture_output=True,
        text=True,
    )
    print(probe.stdout.strip() or probe.stderr.strip()[-2000:], flush=True)
    if probe.returncode:
        raise SystemExit(
            f"the Python models' environment (numpy 1.26 + this host's packages) does not import {modules}"
        )
    return str(python)
