"""``inferctl promote`` and ``inferctl history``: gated promotion of a candidate build."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

DEFAULT_RECORDS = Path("promotions")


def register(sub: argparse._SubParsersAction) -> None:
    from promote.promoter import ALL_GATES

    parser = sub.add_parser(
        "promote",
        help="gate a candidate build and roll it out as version N+1",
        description="Run the parity, accuracy and latency gates on a candidate build (a repository written "
        "by `inferctl build MODEL --repository DIR`) against the production version served by Triton; "
        "when they pass, publish it as version N+1, load it beside N, smoke-test it, give it a canary "
        "share of gateway traffic, then all of it. Any failure rolls back. Every attempt leaves a JSON "
        "record (see `inferctl history`).",
    )
    parser.add_argument("model", help="the model to promote, e.g. efficientnet_lite0")
    parser.add_argument("--candidate", type=Path, required=True, help="candidate repository holding the new build")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"),
                        help="the served repository (default: %(default)s)")
    parser.add_argument("--triton-url", default="127.0.0.1:8000", help="Triton HTTP host:port (default: %(default)s)")
    parser.add_argument("--gateway-url", default=os.environ.get("GATEWAY_URL", ""),
                        help="gateway base URL for canary routing (env GATEWAY_URL; empty: no canary)")
    parser.add_argument("--records-dir", type=Path, default=DEFAULT_RECORDS, help="(default: %(default)s)")
    parser.add_argument("--gate", action="append", choices=ALL_GATES,
                        help="run only this gate (repeatable); its result is kept for a later --publish")
    parser.add_argument("--publish", action="store_true",
                        help="roll out; gates not yet passed for this exact candidate run first")
    parser.set_defaults(handler=run)

    hist = sub.add_parser("history", help="list promotion records",
                          description="List every promotion attempt with its gate results and decision.")
    hist.add_argument("model", nargs="?", help="only this model")
    hist.add_argument("--records-dir", type=Path, default=DEFAULT_RECORDS, help="(default: %(default)s)")
    hist.set_defaults(handler=run_history)


def run(args: argparse.Namespace) -> int:
    from promote.promoter import ALL_GATES, GatewayTraffic, PromotionError, PromotionTarget, promote

    console = Console()
    gateway = None
    if args.gateway_url:
        token = os.environ.get("GATEWAY_ADMIN_TOKEN", "")
        if not token:
            console.print("[red]--gateway-url needs GATEWAY_ADMIN_TOKEN in the environment[/red]")
            return 2
        gateway = GatewayTraffic(args.gateway_url.rstrip("/"), token)
    target = PromotionTarget(args.repository, args.triton_url, args.records_dir, gateway)
    publish = args.publish or not args.gate
    try:
        record = promote(args.model, args.candidate, target, gates=args.gate or ALL_GATES, publish=publish,
                         log=console.print)
    except PromotionError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    return 0 if record.decision in ("promoted", "gates-passed") else 1


def run_history(args: argparse.Namespace) -> int:
    from promote.records import history, print_history

    print_history(history(args.records_dir, args.model))
    return 0
