"""``python -m gateway``: see :mod:`gateway.server`."""

from __future__ import annotations

from gateway.server import main

if __name__ == "__main__":
    raise SystemExit(main())
