"""Load tests (locust scenarios), the side-by-side benchmark and the GPU benchmark path."""
