"""``python -m loadtest.bench``: ``inferctl bench platform``."""

from loadtest.registry import run_named

raise SystemExit(run_named("platform"))
