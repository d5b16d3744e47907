"""``python -m loadtest.bench``."""

from loadtest.bench.cli import main

raise SystemExit(main())
