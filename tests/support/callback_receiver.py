"""A real HTTP server that receives job callbacks, as a customer's endpoint would, and verifies their
signatures on its own (``hmac`` and ``hashlib`` here, not the gateway's code).

It listens on 127.0.0.1 on a reserved port in a thread; ``answers`` queues the status codes it answers
with (then 200), ``delay_s`` makes it slow.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from serving.ports import reserve_port

__all__ = ["CallbackReceiver", "Received", "signature_ok"]


def signature_ok(secret: bytes, header: str, body: bytes, tolerance_s: float = 300) -> bool:
    """What a receiver does: ``t=<ts>,v1=<hex HMAC-SHA256(secret, "<ts>." + body)>``, recent,
    constant-time."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if "t" not in fields or "v1" not in fields or abs(time.time() - int(fields["t"])) > tolerance_s:
        return False
    expected = hmac.new(secret, fields["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields["v1"])


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool


@dataclass
class CallbackReceiver:
    """The receiving end of callbacks (start with :meth:`start`, stop with :meth:`stop`)."""

    secret: bytes
    port: int = field(default_factory=reserve_port)
    answers: deque[int] = field(default_factory=deque)
    delay_s: float = 0.0
    location: str = "http://127.0.0.1:9/elsewhere"
    received: list[Received] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CallbackReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified = signature_ok(receiver.secret, headers.get("gateway-signature", ""), body)
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                status = receiver.answers.popleft() if receiver.answers else 200
                with receiver._arrived:
                    receiver.received.append(Received(self.path, headers, body, verified))
                    receiver._arrived.notify_all()
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Received]:
        """The requests received, once there are at least ``count`` (fails after ``timeout_s``)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.received) >= count, timeout_s):
                raise AssertionError(
                    f"{len(self.received)} callbacks arrived within {timeout_s} s, expected {count}"
                )
            return list(self.received)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
