"""Load generation and benchmarks: the one load generator (:mod:`loadtest.loadgen`), the locust
scenarios (:mod:`loadtest.run`), the side-by-side and gateway-overhead benchmarks
(:mod:`loadtest.bench`) and the GPU benchmark path."""
