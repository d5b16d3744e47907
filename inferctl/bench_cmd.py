"""``inferctl bench``: the benchmarks, each a command that prints a table (and saves a plot)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="side-by-side benchmarks (platform vs baselines, gateway overhead, clients, QoS by tier, many models, tenant isolation)",
        description="`inferctl bench platform ...` runs loadtest.bench (batching on/off, gateway vs direct, "
        "naive FastAPI+PyTorch, raw onnxruntime); `inferctl bench gateway ...` runs "
        "loadtest.bench.gateway_overhead (the gateway's added latency); `inferctl bench clients ...` runs "
        "loadtest.clients_bench (gateway vs direct Triton over KServe v2 HTTP and gRPC with tritonclient); "
        "`inferctl bench qos ...` runs loadtest.qos (premium P99 and free-tier shedding at 2x the saturating "
        "load, tier priorities off and on); `inferctl bench multimodel ...` runs loadtest.multimodel (many "
        "models under a memory budget: hit rate, cold-load P50/P99, loaded models' P99 beside all loaded, "
        "memory against the budget); `inferctl bench isolation ...` runs loadtest.isolation (an enterprise key's "
        "P99 alone and under each attack from a free-tier key, and the gateway's CPU per request). "
        "Options after the name go to that benchmark; see "
        "`inferctl bench platform --help`.",
    )
    parser.add_argument(
        "which", choices=["platform", "gateway", "clients", "qos", "multimodel", "isolation"]
    )
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.which == "platform":
        from loadtest.bench import main
    elif args.which == "clients":
        from loadtest.clients_bench import main
    elif args.which == "qos":
        from loadtest.qos import main
    elif args.which == "multimodel":
        from loadtest.multimodel import main
    elif args.which == "isolation":
        from loadtest.isolation import main
    else:
        from loadtest.bench.gateway_overhead import main
    return int(main(args.options) or 0)
