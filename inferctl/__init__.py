"""``inferctl``: the platform's one command line (build, up, bench, promote, history)."""
