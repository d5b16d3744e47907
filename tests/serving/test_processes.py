"""The process helper and the port reservations every server of the platform is started with."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.ports import reserve_port, reserve_ports, reserved_range
from serving.processes import ManagedProcess, ProcessStartError, child_env, python_module


def test_reserved_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    ports = reserve_ports(40)
    assert len(set(ports)) == len(ports)
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for port in ports:
        assert port in reserved_range()
        assert not low <= port <= high, (
            "a reserved port in the ephemeral range can be taken by any client"
        )


def test_another_process_cannot_reserve_a_port_this_one_holds() -> None:
    port = reserve_port()
    probe = (
        "import sys; from serving.ports import _REGISTRY; "
        "print(_REGISTRY._try_lock(int(sys.argv[1])))"
    )
    taken = subprocess.run(
        [sys.executable, "-c", probe, str(port)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert taken.stdout.split() == ["False"], taken.stdout + taken.stderr


def test_a_server_is_ready_and_stopped_with_its_whole_group(tmp_path: Path) -> None:
    port = reserve_port()
    # The server starts a grandchild that would outlive a plain terminate of its parent.
    script = (
        "import subprocess, sys, http.server;"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        "print('grandchild', child.pid, flush=True);"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    server = ManagedProcess(
        [sys.executable, "-c", script],
        name="probe server",
        log_path=tmp_path / "probe.log",
        cwd=tmp_path,
    )
    with server:
        server.wait_http(f"http://127.0.0.1:{port}/", timeout_s=60)
        assert server.running()
        grandchild = int(
            next(line for line in server.log_lines() if line.startswith("grandchild")).split()[1]
        )
    assert not server.running() and server.returncode is not None
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the server's own child outlived stop()"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent, init) counts as gone.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def test_a_child_that_exits_early_fails_with_its_output() -> None:
    child = ManagedProcess(
        [sys.executable, "-c", "print('cannot open the model repository'); raise SystemExit(3)"],
        name="doomed",
    ).start()
    with pytest.raises(
        ProcessStartError, match="(?s)doomed exited with code 3.*cannot open the model repository"
    ):
        child.wait_until(lambda: False, timeout_s=60)


def test_a_child_that_never_gets_ready_is_stopped_and_says_so() -> None:
    child = ManagedProcess(
        python_module("http.server", "--bind", "127.0.0.1", str(reserve_port())), name="silent"
    ).start()
    with pytest.raises(ProcessStartError, match="silent was not ready after 1 s"):
        child.wait_until(lambda: False, timeout_s=1)
    assert not child.running()
    with pytest.raises(ProcessStartError, match="could not be started"):
        ManagedProcess(["/nonexistent/server"], name="ghost").start()
