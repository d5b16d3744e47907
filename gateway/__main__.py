"""``python -m gateway``: see :mod:`gateway.http.server`."""

from __future__ import annotations

from gateway.http.server import main

if __name__ == "__main__":
    raise SystemExit(main())
