"""A newcomer's first hour, measured: ``python -m loadtest.newcomer OUT_DIR``.

Runs what the README tells a new user to run and what an operator then fears, on the real stack:

1. ``inferctl up`` (what ``./run up`` runs) with its defaults, and a fresh state folder so it prints
   a first API key; ``up_s`` is the time from the command to ``/readyz`` answering 200 (bounded);
2. every model ``/readyz`` checks (the default models it serves) called once through its public
   route: ``/v1/classify``, ``/v1/embeddings``, ``/v1/images/generations`` by the model card's task,
   KServe v2 inference (the readiness probe's synthetic request) for plain tensor models;
3. one Python stub killed (``kill -9``, as the OOM killer would; the embedding pipeline's tokenizer
   by default, the stub the issue saw die), and the model called until it answers steadily again;
   ``stub_kill_recovery_s`` is from the kill to the first of those answers.

It writes ``OUT_DIR/newcomer.json``::

    {"up_s": float, "readyz_status": int, "models_answering": [str], "models_failing": [str],
     "stub_kill_recovery_s": float, "images_default_call_s": float | null}

``images_default_call_s`` is one default ``/v1/images/generations`` call when the stack serves an
image-generation model (else null). The end-to-end test (tests/e2e/test_newcomer.py) runs the same
steps through :class:`Stack`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from serving.model_card import ModelCard, Task
from serving.processes import ManagedProcess, python_module
from serving.readiness import infer_body, probe_inputs, probe_png
from serving.stub_watch import Stub, stub_processes

__all__ = [
    "NewcomerRecord",
    "Stack",
    "build_parser",
    "call_model",
    "kill_stub",
    "run",
    "start_stack",
    "wait_healed",
]

UP_TIMEOUT_S = 900.0  # a first build of every default model on a small machine
READY_TIMEOUT_S = 300.0
RECOVERY_WINDOW_S = 30.0
STEADY_ANSWERS = 3
#: the stub killed by default: (public model polled, model whose stub dies)
DEFAULT_VICTIM = ("text_embedding", "text_tokenizer")
_KEY = re.compile(r"(gk_[A-Za-z0-9_\-]+)")


@dataclass(frozen=True)
class NewcomerRecord:
    """What ``newcomer.json`` holds (the module docstring says what each means)."""

    up_s: float
    readyz_status: int
    models_answering: list[str]
    models_failing: list[str]
    stub_kill_recovery_s: float | None
    images_default_call_s: float | None


@dataclass
class Stack:
    """A running ``inferctl up``: its process, gateway URL and first API key."""

    process: ManagedProcess
    base_url: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def triton_pid(self) -> int:
        """The ``tritonserver`` process ``inferctl up`` started (and supervises)."""
        pid = self.process.pid
        assert pid is not None
        for child in psutil.Process(pid).children(recursive=True):
            if child.name() == "tritonserver":
                return child.pid
        raise RuntimeError("inferctl up runs no tritonserver")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> httpx.Response:
        """Poll ``/readyz`` until 200 or ``timeout_s``; the last answer."""
        deadline = time.monotonic() + timeout_s
        while True:
            response = httpx.get(self.base_url + "/readyz", timeout=60)
            if response.status_code == 200 or time.monotonic() > deadline:
                return response
            time.sleep(1)


@contextmanager
def start_stack(
    args: Sequence[str],
    state_dir: Path,
    gateway_port: int = 8080,
    timeout_s: float = UP_TIMEOUT_S,
    log_path: Path | None = None,
) -> Iterator[Stack]:
    """``inferctl up ARGS`` with a fresh state folder, until it has printed its welcome; stopped after.

    ``log_path``, when given, receives its output (where ``up_s`` went); it holds the first API key.

    Raises:
        ProcessStartError: it exited or did not come up in ``timeout_s``.
    """
    command = python_module("inferctl", "up", "--state-dir", str(state_dir), *args)
    env = dict(os.environ, COLUMNS="200", GATEWAY_ADMIN_TOKEN="")
    process = ManagedProcess(command, name="inferctl up", env=env, log_path=log_path).start()
    try:
        process.wait_until(
            lambda: "Press Ctrl-C" in process.log_tail(),
            timeout_s=timeout_s,
            what="printing its welcome",
        )
        key = _KEY.search("\n".join(process.log_lines()))
        if key is None:
            raise RuntimeError(f"inferctl up printed no API key:\n{process.log_tail()}")
        yield Stack(process, f"http://127.0.0.1:{gateway_port}", key.group(1))
    finally:
        process.stop(timeout_s=60)


def model_task(stack: Stack, model: str) -> Task | None:
    """The model card's task, read through the gateway (KServe v2 model configuration)."""
    response = httpx.get(
        f"{stack.base_url}/v2/models/{model}/config", headers=stack.headers, timeout=30
    )
    response.raise_for_status()
    return ModelCard.from_config(response.json()).task


def call_model(
    stack: Stack, model: str, task: Task | None, timeout_s: float = 120.0
) -> httpx.Response:
    """One request to ``model`` through its public route, as a client would send it."""
    url, headers = stack.base_url, stack.headers
    public: tuple[str, dict[str, Any]] | None = None
    if task == Task.CLASSIFICATION:
        public = "/v1/classify", {"files": {"file": ("probe.png", probe_png(32), "image/png")}}
    elif task == Task.EMBEDDINGS:
        public = "/v1/embeddings", {"json": {"model": model, "input": "hello world"}}
    elif task == Task.IMAGE_GENERATION:
        public = (
            "/v1/images/generations",
            {"json": {"model": model, "prompt": "a red apple on a table"}},
        )
    if public is not None:
        path, request = public
        return httpx.post(f"{url}{path}", headers=headers, timeout=timeout_s, **request)
    config = httpx.get(f"{url}/v2/models/{model}/config", headers=headers, timeout=30).json()
    body, extra = infer_body(probe_inputs(config))
    return httpx.post(
        f"{url}/v2/models/{model}/infer",
        headers={**headers, **extra},
        content=body,
        timeout=timeout_s,
    )


def kill_stub(triton_pid: int, model: str) -> Stub:
    """``kill -9`` one stub of ``model`` (as the OOM killer would); the stub killed."""
    stubs = [stub for stub in stub_processes(triton_pid) if stub.model == model]
    if not stubs:
        raise RuntimeError(f"no Python stub of {model!r} runs under Triton {triton_pid}")
    os.kill(stubs[0].pid, signal.SIGKILL)
    return stubs[0]


def wait_healed(
    call: Callable[[], int], since: float, window_s: float = RECOVERY_WINDOW_S
) -> float | None:
    """Call until ``STEADY_ANSWERS`` 200s in a row follow a failure (or the window ends).

    Returns:
        Seconds from ``since`` to the first of those 200s; ``None`` when the window ended first. A
        model that never failed within the window (the dead instance never chosen) counts as healed
        from its first answer.
    """
    statuses: list[tuple[float, int]] = []
    while time.monotonic() - since < window_s:
        statuses.append((time.monotonic(), call()))
        failed = [k for k, (_, status) in enumerate(statuses) if status != 200]
        tail = statuses[failed[-1] + 1 :] if failed else statuses
        if len(tail) >= STEADY_ANSWERS and (failed or len(statuses) >= 10 * STEADY_ANSWERS):
            return tail[0][0] - since
        time.sleep(0.2)
    return None


def measure(
    args: Sequence[str],
    state_dir: Path,
    victim: tuple[str, str] = DEFAULT_VICTIM,
    up_log: Path | None = None,
) -> NewcomerRecord:
    """The newcomer's steps on ``inferctl up ARGS`` (the module docstring lists them)."""
    started = time.monotonic()
    with start_stack(args, state_dir, log_path=up_log) as stack:
        ready = stack.wait_ready()
        up_s = time.monotonic() - started
        models = list(ready.json().get("models", [])) if ready.status_code == 200 else []
        tasks = {model: model_task(stack, model) for model in models}
        answering: list[str] = []
        failing: list[str] = []
        images_s: float | None = None
        for model in models:
            call_started = time.monotonic()
            ok = call_model(stack, model, tasks[model]).status_code == 200
            if tasks[model] == Task.IMAGE_GENERATION and images_s is None and ok:
                images_s = time.monotonic() - call_started
            (answering if ok else failing).append(model)
        public, dying = victim if victim[0] in models else (models[0], models[0])
        kill_stub(stack.triton_pid(), dying)
        killed_at = time.monotonic()
        recovery = wait_healed(
            lambda: call_model(stack, public, tasks[public], 30).status_code, killed_at
        )
    return NewcomerRecord(
        round(up_s, 2),
        ready.status_code,
        answering,
        failing,
        None if recovery is None else round(recovery, 2),
        None if images_s is None else round(images_s, 2),
    )


def build_parser() -> argparse.ArgumentParser:
    """``inferctl bench newcomer``'s options."""
    parser = argparse.ArgumentParser(
        description="Run `inferctl up` as a newcomer would and write OUT_DIR/newcomer.json."
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("up_args", nargs="*", help="extra `inferctl up` options (after --)")
    parser.add_argument(
        "--up-log",
        type=Path,
        metavar="PATH",
        help="write `inferctl up`'s output there (it shows the first API key: keep it out of OUT_DIR)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """``inferctl bench newcomer``: the parsed options in, the exit status out."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix="newcomer-state-"
    ) as state:  # keys and tokens stay out of OUT_DIR
        record = measure(args.up_args, Path(state) / "state", up_log=args.up_log)
    (args.out_dir / "newcomer.json").write_text(json.dumps(asdict(record), indent=2) + "\n")
    print(json.dumps(asdict(record), indent=2))
    return (
        0
        if record.readyz_status == 200
        and not record.models_failing
        and record.stub_kill_recovery_s is not None
        else 1
    )


if __name__ == "__main__":
    from loadtest.registry import run_named

    raise SystemExit(run_named("newcomer"))
