"""The GPU meter reads Triton's metrics page over real HTTP (a loopback page server, no GPU)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.backends.residency_memory import GpuMetricsMeter

PAGE = b'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 1.5e+09\n'


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_the_meter_is_built_outside_a_loop_and_read_from_several(metrics_url: str) -> None:
    # The multimodel benchmark builds the meter before any loop runs, then reads it from two
    # asyncio.run calls (calibration, then the traffic): a session bound to one loop broke both.
    meter = GpuMetricsMeter(metrics_url, settle_s=0.0)
    assert asyncio.run(meter.used_bytes()) == 1_500_000_000
    assert asyncio.run(meter.used_bytes()) == 1_500_000_000
    asyncio.run(meter.close())
