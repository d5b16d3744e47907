"""Keep the embedded Triton running: restart it, with back-off, when it dies on its own; and watch
its model stubs (:mod:`serving.stub_watch`: memory limits, shared memory of stubs that are gone)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from serving.launcher import TritonServer, TritonStartError
from serving.stub_watch import StubWatch

__all__ = ["TritonSupervisor"]

log = logging.getLogger("serving.supervisor")


@dataclass
class TritonSupervisor:
    """Watches a started :class:`TritonServer` and restarts it after a crash.

    Args:
        server: a started server; the supervisor restarts it on the same ports.
        poll_s: how often to look at the process.
        max_backoff_s: longest wait between failed restart attempts.
        stub_poll_s: how often to look at the model stubs (memory, shared memory).
    """

    server: TritonServer
    poll_s: float = 0.2
    max_backoff_s: float = 10.0
    stub_poll_s: float = 0.5
    restarts: int = field(default=0, init=False)
    stubs: StubWatch | None = field(default=None, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def start(self) -> TritonSupervisor:
        self._thread = threading.Thread(target=self._watch, name="triton-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, then stop Triton."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.server.stop()
        if self.stubs is not None:
            self.stubs.release()

    def _look_at_stubs(self) -> None:
        pid = self.server.pid
        if pid is None:
            return
        if self.stubs is None or self.stubs.triton_pid != pid:
            self.stubs = StubWatch(pid)
        self.stubs.poll()

    def _watch(self) -> None:
        backoff = 0.5
        next_stub_look = 0.0
        while not self._stop.wait(self.poll_s):
            if self.server.running():
                backoff = 0.5
                if time.monotonic() >= next_stub_look:
                    self._look_at_stubs()
                    next_stub_look = time.monotonic() + self.stub_poll_s
                continue
            log.warning(
                "Triton exited unexpectedly; restarting. Last log lines:\n%s",
                self.server.log_tail(10),
            )
            try:
                self.server.stop()  # reap the dead process and its backend folder
                if self.stubs is not None:
                    self.stubs.release()  # the crashed Triton's stubs are gone with it
                self.server.start()
                self.restarts += 1
                log.warning("Triton is serving again (restart %d)", self.restarts)
            except TritonStartError as exc:
                log.error("restarting Triton failed, retrying in %.1f s: %s", backoff, exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)

    def __enter__(self) -> TritonSupervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
