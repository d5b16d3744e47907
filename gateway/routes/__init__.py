"""HTTP routers, one module per API: health, KServe v2, OpenAI-style, classify, stats, admin."""
