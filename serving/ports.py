"""TCP ports reserved for the servers this process starts (Triton, gateways, redis-server, baselines).

The usual trick, "bind port 0, read the number, close the socket, hand the number to the child",
collides in two ways, both seen in our test suite on a busy machine:

- the kernel may hand the same just-released port out again, so one call site got the same port
  for Triton's gRPC and metrics endpoints;
- the port lies in the kernel's ephemeral range, where every outgoing connection on the machine
  takes its local port, and where every other process using the same trick looks too, so another
  client or test session can take it before our child binds it.

The two other race-free designs do not fit every server we start: Triton and redis-server can
neither take over a listening socket from their parent nor report the port they got from binding
port 0, and holding a bound socket until the child binds only works for servers that set
``SO_REUSEPORT`` (Triton's metrics endpoint and redis-server do not). So a port is reserved instead:

1. it is drawn from a range *below* the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
   so no outgoing connection can be given it;
2. it is locked, for the lifetime of this process, with a one-byte ``fcntl`` record lock at offset
   ``port`` in one lock file shared by every process of the platform on this machine, so no other
   test session, benchmark or client process picks it (the lock goes away with the process, even
   after ``kill -9``);
3. this process remembers it and never hands it out twice;
4. it must bind right now (a program outside the platform may listen there).

What remains is a program outside the platform binding that exact port on purpose between step 4
and our child's bind; the child then fails loudly with "address in use", it never shares a port.
A server restarted on its ports (the Triton supervisor) keeps them, because they stay reserved.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

__all__ = ["reserve_port", "reserve_ports", "reserved_range"]

_LOCK_FILE_NAME = "triton-platform-ports.lock"
_LOWEST = 20000
_MIN_RANGE = 1000
_ATTEMPTS = 2000


def reserved_range() -> range:
    """The ports reservations are drawn from: below the kernel's ephemeral range when it leaves room."""
    low, high = 32768, 60999  # Linux's default, also used where the file does not exist (macOS)
    try:
        low, high = (
            int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        )
    except (OSError, ValueError):
        pass
    if low - _LOWEST >= _MIN_RANGE:
        return range(_LOWEST, low)
    return range(high + 1, 65536)


class _Registry:
    """This process's reservations; one per process because ports and record locks are per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._fd: int | None = None

    def _lock_fd(self) -> int:
        if self._fd is None:
            path = Path(tempfile.gettempdir()) / _LOCK_FILE_NAME
            try:
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except (
                PermissionError
            ):  # another user's file: lock among this user's processes at least
                self._fd = os.open(
                    path.with_name(f"{_LOCK_FILE_NAME}.{os.getuid()}"),
                    os.O_RDWR | os.O_CREAT,
                    0o600,
                )
        return self._fd

    def _try_lock(self, port: int) -> bool:
        try:
            fcntl.lockf(self._lock_fd(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return False  # another process of the platform holds it
            raise
        return True

    def _unlock(self, port: int) -> None:
        fcntl.lockf(self._lock_fd(), fcntl.LOCK_UN, 1, port, os.SEEK_SET)

    def reserve(self, host: str) -> int:
        candidates = reserved_range()
        with self._lock:
            for _ in range(_ATTEMPTS):
                port = random.choice(candidates)
                if port in self._held or not self._try_lock(port):
                    continue
                if not _binds(host, port):
                    self._unlock(port)
                    continue
                self._held.add(port)
                return port
        raise OSError(
            f"no free port to reserve in {candidates.start}-{candidates.stop - 1} after {_ATTEMPTS} tries"
        )

    def forget_after_fork(self) -> None:
        # Record locks are not inherited by a forked child: it holds none, so it must not believe it
        # does. The parent's locks keep the child from taking the parent's ports.
        self._lock = threading.Lock()
        self._held = set()
        self._fd = None


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


_REGISTRY = _Registry()  # process-wide on purpose: ports and fcntl locks belong to the process
os.register_at_fork(after_in_child=_REGISTRY.forget_after_fork)


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port no other process of the platform will use while this process lives, free right now.

    Args:
        host: the address the server will bind (the bind check is made there).

    Returns:
        The port number; it stays reserved until this process exits.

    Raises:
        OSError: the whole range is taken.
    """
    return _REGISTRY.reserve(host)


def reserve_ports(count: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """``count`` distinct reserved ports (see :func:`reserve_port`)."""
    return tuple(_REGISTRY.reserve(host) for _ in range(count))
