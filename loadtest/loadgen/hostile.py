"""Targets that behave as a hostile client would, for the isolation benchmark (:mod:`loadtest.isolation`).

- :class:`IdleConnectionTarget`: each worker holds one TCP connection open and sends nothing, until
  the server closes it (its header deadline) or ``hold_s`` passes; then it opens the next one.
- :class:`DisconnectTarget`: each worker sends a whole request and hangs up after
  ``abandon_after_s`` unless the answer's status line came first (a disconnect storm).
- :class:`PacedTarget`: another target's requests at a fixed rate (request ``index`` leaves at
  ``index / rate_per_s`` seconds after the first), however fast they are answered.

Like every target these are frozen dataclasses of plain data, so the load generator can send them to
its worker processes. Outcomes keep the server's status where one came (408 for a connection the
server timed out, 429 for a refused request); ``0`` is a connection refused or reset, and
:data:`ABANDONED` a request the client walked away from.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from loadtest.loadgen.targets import Outcome, Send, Target

__all__ = ["ABANDONED", "DisconnectTarget", "IdleConnectionTarget", "PacedTarget"]

#: the outcome status of a request the client hung up on before its answer (nginx's 499)
ABANDONED = 499
_STATUS_LINE_BYTES = 64


def _host_port(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"an http:// URL with a host is needed, not {url!r}")
    path = parts.path or "/"
    return parts.hostname, parts.port or 80, path + (f"?{parts.query}" if parts.query else "")


def _status_of(line: bytes) -> int | None:
    """The status code of an HTTP/1.x status line, or None."""
    fields = line.split(b" ", 2)
    if len(fields) >= 2 and fields[0].startswith(b"HTTP/") and fields[1].isdigit():
        return int(fields[1])
    return None


@dataclass(frozen=True)
class _Endpoint:
    """Where a connection goes, and the local address it leaves from (``None``: the system's)."""

    host: str
    port: int
    source_address: str | None


async def _open(endpoint: _Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    local = None if endpoint.source_address is None else (endpoint.source_address, 0)
    return await asyncio.open_connection(endpoint.host, endpoint.port, local_addr=local)


async def _close(writer: asyncio.StreamWriter, abort: bool) -> None:
    if abort:
        writer.transport.abort()  # no FIN handshake: the way a killed client goes
        return
    writer.close()
    with contextlib.suppress(OSError, ConnectionError):
        await writer.wait_closed()


async def _exchange(
    endpoint: _Endpoint,
    request: bytes,
    wait_s: float,
    *,
    abort: bool,
    on_timeout: Outcome,
    detail: Callable[[int | None, bytes], str | None],
) -> Outcome:
    """One connection: ``request`` written (if any), then up to ``wait_s`` for the server's first line.

    The connection is closed after, with a reset where ``abort`` (and always when it failed). The
    outcome: ``on_timeout`` when no line came in ``wait_s``; status 0 for a failed connection; else the
    line's status (0: none) with ``detail(status, the line's first 200 bytes)`` as its message.
    """
    try:
        reader, writer = await _open(endpoint)
    except OSError as exc:
        return 0, None, None, f"no connection: {exc!r}"
    try:
        if request:
            writer.write(request)
            await writer.drain()
        line = await asyncio.wait_for(reader.readline(), wait_s)
    except TimeoutError:
        await _close(writer, abort=abort)
        return on_timeout
    except OSError as exc:
        await _close(writer, abort=True)
        return 0, None, None, f"reset: {exc!r}"
    await _close(writer, abort=abort)
    status = _status_of(line[:_STATUS_LINE_BYTES])
    return (status or 0), None, None, detail(status, line[:200])


@dataclass(frozen=True, kw_only=True)
class IdleConnectionTarget:
    """Connections that say nothing.

    Args:
        url: the server (only host and port are used).
        hold_s: how long one connection is held at most before the client closes it itself.
        source_address: the local address connections leave from (``None``: the system's choice).
    """

    url: str
    hold_s: float = 30.0
    name: str = "idle connections"
    source_address: str | None = None

    def describe(self) -> str:
        return f"idle TCP connections held up to {self.hold_s:g} s each"

    @contextlib.asynccontextmanager
    async def connect(self, concurrency: int) -> AsyncIterator[Send]:
        host, port, _ = _host_port(self.url)

        async def send(worker: int, index: int) -> Outcome:
            # What the server says (if anything) before it closes: its head deadline's 408. Held
            # the whole time (the timeout) is a 200: the attack did what it meant to.
            return await _exchange(
                _Endpoint(host, port, self.source_address),
                b"",
                self.hold_s,
                abort=False,
                on_timeout=(200, None, None, None),
                detail=lambda _, head: head.decode(errors="replace") or "closed by the server",
            )

        yield send


@dataclass(frozen=True, kw_only=True)
class DisconnectTarget:
    """Whole requests whose client hangs up before the answer.

    Args:
        url: the full URL (``http://host:port/path``).
        body: the request body.
        headers: sent with it (credentials, content type).
        abandon_after_s: how long after the last byte was written the client waits for a status line.
        source_address: the local address connections leave from (``None``: the system's choice).
    """

    url: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    abandon_after_s: float = 0.005
    name: str = "disconnects"
    source_address: str | None = None

    def describe(self) -> str:
        return f"POSTs of {len(self.body):,} bytes abandoned {1000 * self.abandon_after_s:g} ms after sending"

    @contextlib.asynccontextmanager
    async def connect(self, concurrency: int) -> AsyncIterator[Send]:
        host, port, path = _host_port(self.url)
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {host}:{port}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
        ]
        head += [f"{name}: {value}" for name, value in self.headers.items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body

        async def send(worker: int, index: int) -> Outcome:
            return await _exchange(
                _Endpoint(host, port, self.source_address),
                request,
                self.abandon_after_s,
                abort=True,
                on_timeout=(ABANDONED, None, None, "abandoned before the answer"),
                detail=lambda status, head: (
                    None if status == 200 else head.decode(errors="replace")
                ),
            )

        yield send


@dataclass(frozen=True, kw_only=True)
class PacedTarget:
    """``inner``'s requests at ``rate_per_s`` in all (spread over the workers), not as fast as answered.

    Args:
        inner: the target whose requests are sent.
        rate_per_s: requests per second this process sends in all.
    """

    inner: Target
    rate_per_s: float
    name: str = "paced"

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s must be positive, not {self.rate_per_s!r}")

    def describe(self) -> str:
        return f"{self.inner.describe()}, paced at {self.rate_per_s:g}/s"

    @contextlib.asynccontextmanager
    async def connect(self, concurrency: int) -> AsyncIterator[Send]:
        started: list[float] = []  # the first request's departure, shared by this process's workers
        async with self.inner.connect(concurrency) as inner_send:

            async def send(worker: int, index: int) -> Outcome:
                if not started:
                    started.append(time.monotonic() - index / self.rate_per_s)
                await asyncio.sleep(
                    max(0.0, started[0] + index / self.rate_per_s - time.monotonic())
                )
                return await inner_send(worker, index)

            yield send
