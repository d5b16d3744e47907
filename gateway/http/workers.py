"""Several gateway worker processes, each first given a listening socket of its own (``SO_REUSEPORT``).

uvicorn's supervisor (``uvicorn.run(workers=N)``) hands every worker one shared listening socket, and
asyncio accepts every pending connection each time a worker wakes. So a burst of new connections
(a client's pool, a load generator) lands on the first workers to wake, and a keep-alive connection
stays where it landed. Measured with ``loadtest/probes/worker_balance.py``
(benchmarks/cpu/worker-balance-2026-12-07): of 8 workers the busiest held 2.1x its share of 128
connections and 2-3 held none.

Here each worker starts with a socket of its own. All of them are bound to the same address with
``SO_REUSEPORT``, so Linux spreads new connections over them by their address hash. The supervisor
is uvicorn's own (signals, health pings, restarts). A worker that replaces a dead one serves every
socket, the dead worker's included. The parent keeps all the sockets open, so connections queued on
a dead worker's socket wait there for its replacement and are not reset. The price: a worker whose
event loop is stuck keeps getting its share of new connections until uvicorn's health ping
(``timeout_worker_healthcheck``) has it replaced, where with one shared socket the others would
have taken them.

Elsewhere (no ``SO_REUSEPORT`` load balancing: macOS, Windows) the workers share one socket, as
uvicorn does it.
"""

from __future__ import annotations

import logging
import socket
import sys

from uvicorn import Config
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

__all__ = ["OwnSocketWorkers", "balances_connections", "reuse_port_sockets", "serve_workers"]

log = logging.getLogger("gateway")


def balances_connections() -> bool:
    """Whether this kernel spreads connections over sockets that share a port (Linux does)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def reuse_port_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` TCP sockets bound to ``host:port`` with ``SO_REUSEPORT``, not listening yet (each
    worker's server listens on its own). Port 0: the first socket's port is given to the others.

    Raises:
        OSError: the address cannot be bound (in use by another program, not local).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class OwnSocketWorkers(Multiprocess):
    """uvicorn's multi-process supervisor, whose first workers each serve one of ``sockets``."""

    def init_processes(self) -> None:
        for sock in self.sockets:
            process = Process(self.config, [sock])
            process.start()
            self.processes.append(process)


def serve_workers(config: Config) -> None:
    """Run ``config.workers`` worker processes of ``config``'s app until a signal stops them."""
    if not balances_connections():
        supervisor, sockets = Multiprocess, [config.bind_socket()]
    else:
        try:
            sockets = reuse_port_sockets(config.host, config.port, config.workers)
        except OSError as exc:  # as uvicorn's own bind: say why, exit as a failed start
            log.error("gateway: cannot listen on %s:%s: %s", config.host, config.port, exc)
            sys.exit(STARTUP_FAILURE)
        supervisor = OwnSocketWorkers
    try:
        supervisor(config, sockets=sockets).run()
    except KeyboardInterrupt:  # as uvicorn.run: Ctrl+C stops the workers, not with a traceback
        pass
    finally:
        for sock in sockets:
            sock.close()
