"""Who used the host's CPUs during one load point: the benchmark's processes, grouped, from ``/proc``.

On a GPU host the serving path is CPU work as much as GPU work (HTTP parsing, the gateway's Python,
Triton's core, its Python stubs, the load generator itself), and all of it shares one host's cores.
Two snapshots around a load point give, per group, the cores it kept busy and its CPU milliseconds
per request, and the host's busy cores overall: a group near its cores' worth, or a host near all
of them, is where throughput stops.

Groups are read from the process tree under this (the benchmark's) process: ``triton`` (the
server's own threads: HTTP/gRPC, the batcher), ``stub <model>`` (the Python backend's
processes of each model), ``gateway`` (all its workers), ``naive server``, ``redis``, and ``load generator``
(this process and the client processes it started and reaped during the point; a process that
ended is counted through its parent's ``cutime``/``cstime``). Linux only: elsewhere the snapshots
are empty and the split is not reported.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["GROUPS", "cpu_snapshot", "cpu_split"]

#: (group, what its command line contains), first match wins
GROUPS: tuple[tuple[str, str], ...] = (
    ("triton stubs", "triton_python_backend_stub"),
    ("triton", "tritonserver"),
    ("gateway", "gateway"),
    ("naive server", "naive_server"),
    ("redis", "redis-server"),
)

_PROC = Path("/proc")


def _stat(pid: str) -> tuple[int, float, float] | None:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of ``pid``."""
    try:
        text = (_PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    ticks = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / ticks
    children = (int(fields[13]) + int(fields[14])) / ticks
    return int(fields[1]), own, children


def _cmdline(pid: str) -> str:
    try:
        return (_PROC / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _host_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _group(cmdline: str) -> str:
    name = next((name for name, needle in GROUPS if needle in cmdline), "load generator")
    if (
        name == "triton stubs"
    ):  # one group per model: its arguments name the instance, "<model>_<group>_<n>"
        args = cmdline.split()
        instance = args[8] if len(args) > 8 else ""
        return f"stub {re.sub(r'(_[0-9]+){1,2}$', '', instance)}" if instance else name
    return name


def cpu_snapshot() -> dict[str, float]:
    """CPU seconds used so far by each group of this process's tree, and ``host`` (all cores)."""
    if not (_PROC / "self" / "stat").exists():
        return {}
    stats = {pid: s for pid in os.listdir(_PROC) if pid.isdigit() and (s := _stat(pid)) is not None}
    children: dict[int, list[str]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    seconds: dict[str, float] = {"host": _host_busy_s()}
    me = str(os.getpid())
    _, own, reaped = stats[me]
    seconds["load generator"] = own + reaped
    pending = [(pid, "") for pid in children.get(int(me), [])]
    while (
        pending
    ):  # every descendant, in the group of the nearest ancestor (or itself) that names one
        pid, inherited = pending.pop()
        group = _group(_cmdline(pid)) if not inherited or inherited == "triton" else inherited
        used = stats[pid][1] + stats[pid][2]
        seconds[group] = seconds.get(group, 0.0) + used
        seconds[f"{group}#{pid}"] = used  # each process apart too: the busiest of a group
        pending += [(child, group) for child in children.get(int(pid), [])]
    return seconds


def cpu_split(
    before: dict[str, float], after: dict[str, float], seconds: float, requests: int
) -> dict[str, dict[str, float]]:
    """Per group: cores kept busy over ``seconds``, CPU milliseconds per request, and the cores of its
    busiest process (a group of several workers can be held back by one)."""
    if not before or not after or seconds <= 0:
        return {}
    split: dict[str, dict[str, float]] = {}
    for key in after:
        used = after[key] - before.get(key, 0.0)
        group, _, pid = key.partition("#")
        if not pid:
            split.setdefault(group, {}).update(
                cores=used / seconds,
                cpu_ms_per_request=1000.0 * used / requests if requests else 0.0,
            )
        else:
            busiest = split.setdefault(group, {})
            busiest["busiest_process_cores"] = max(
                busiest.get("busiest_process_cores", 0.0), used / seconds
            )
    return split
