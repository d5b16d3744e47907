"""What one full garbage collection costs a gateway worker, with and without the start-up freeze.

A full collection walks every object the process holds, and a gateway worker holds its modules, app
and routes from start-up on; :func:`gateway.observe.gc_pauses.freeze_startup_objects` takes those
out of the collector's sight. ``inferctl bench gateway-profile --no-profile`` prints both figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

__all__ = ["full_collection_ms"]

# Run in a fresh interpreter: a process that holds only the gateway's app, as a worker does.
_FULL_COLLECTION = """
import gc, json, sys, time
from pathlib import Path
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.observe.gc_pauses import freeze_startup_objects
app = create_app(GatewaySettings(keys_db=Path(sys.argv[1]) / "keys.sqlite3"))
def timed():
    started = time.perf_counter()
    gc.collect()
    return 1000.0 * (time.perf_counter() - started)
before = min(timed() for _ in range(3))
frozen = freeze_startup_objects()
print(json.dumps({"full_ms": before, "frozen_full_ms": min(timed() for _ in range(3)),
                  "frozen_objects": frozen}))
"""


def full_collection_ms() -> dict[str, float]:
    """What one full collection costs a process that has built the gateway's app, before and after
    :func:`gateway.observe.gc_pauses.freeze_startup_objects` (the best of three each)."""
    with tempfile.TemporaryDirectory(prefix="collector-cost-") as tmp:  # its key store goes here
        out = subprocess.run(
            [sys.executable, "-c", _FULL_COLLECTION, tmp],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return dict(json.loads(out.splitlines()[-1]))
