"""``inferctl promote`` and ``inferctl history``: gated promotion of a candidate build."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path

from inferctl.build_cmd import (
    add_json_option,
    add_repository_option,
    add_weights_option,
    parse_weights,
)
from inferctl.command import Command
from serving.console import json_document, make_console

DEFAULT_RECORDS = Path("promotions")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from promote.promoter import ALL_GATES

    parser.add_argument("model", help="the model to promote, e.g. efficientnet_lite0")
    parser.add_argument(
        "--candidate", type=Path, required=True, help="candidate repository holding the new build"
    )
    add_repository_option(parser, "the served repository")
    parser.add_argument(
        "--triton-url",
        default="127.0.0.1:8000",
        help="Triton HTTP host:port (default: %(default)s)",
    )
    parser.add_argument(
        "--gateway-url",
        default=os.environ.get("GATEWAY_URL", ""),
        help="gateway base URL for canary routing (env GATEWAY_URL; empty: no canary)",
    )
    parser.add_argument(
        "--records-dir", type=Path, default=DEFAULT_RECORDS, help="(default: %(default)s)"
    )
    parser.add_argument(
        "--gate",
        action="append",
        choices=ALL_GATES,
        help="run only this gate (repeatable); its result is kept for a later --publish",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="roll out; gates not yet passed for this exact candidate run first",
    )
    add_weights_option(
        parser,
        "local weights or checkpoint folder, as for `inferctl build` (diffusion networks "
        "read their checkpoint's tokenizer to make their evaluation inputs)",
    )
    add_json_option(parser, "the promotion record")


def _add_history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="only this model")
    parser.add_argument(
        "--records-dir", type=Path, default=DEFAULT_RECORDS, help="(default: %(default)s)"
    )
    add_json_option(parser, "the records")


def run(args: argparse.Namespace) -> int:
    from promote.promoter import (
        ALL_GATES,
        GatewayTraffic,
        PromotionError,
        PromotionOptions,
        PromotionTarget,
        promote,
    )

    # With --json, stdout carries only the record; the step-by-step log goes to stderr.
    console = make_console(stderr=args.json)
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
        record = promote(
            args.model,
            args.candidate,
            target,
            options=PromotionOptions(
                gates=args.gate or ALL_GATES,
                publish=publish,
                log=console.print,
                observer=lambda step: console.print(_describe(args.model, step)),
                weights=parse_weights(args.weights),
            ),
        )
    except PromotionError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    if args.json:
        print(json_document("promote", [asdict(record)]))
    if record.decision == "rollback-incomplete":
        return 3  # an operator must look: the record names the rollback steps that could not run
    return 0 if record.decision in ("promoted", "gates-passed") else 1


def _describe(model: str, step: dict[str, object]) -> str:
    failed = step.get("ok") is False
    return f"{model}: {step['step']}" + (f" FAILED: {step.get('error') or ''}" if failed else "")


def run_history(args: argparse.Namespace) -> int:
    from promote.records import history, print_history

    records = history(args.records_dir, args.model)
    if args.json:
        print(json_document("history", [asdict(r) for r in records]))
    else:
        print_history(records, make_console())
    return 0


PROMOTE = Command(
    name="promote",
    help="gate a candidate build and roll it out as version N+1",
    description="Run the parity, accuracy and latency gates on a candidate build (a repository written "
    "by `inferctl build MODEL --repository DIR`) against the production version served by Triton; "
    "accuracy is the model family's own evaluation (classifiers: top-1/top-5 agreement on the golden "
    "photographs; encoders: embedding cosine on held-out sentences; diffusion networks: PSNR at a fixed "
    "seed). When they pass, publish it as version N+1 (marked unfinished until the end), load it beside "
    "N with the ensembles that call the model kept on N, smoke-test it, give it a canary share of the "
    "gateway's traffic (the ensembles' too, through canary copies), then all of it. Any failure rolls "
    "back, every rollback step on its own. Every attempt leaves a JSON record (see `inferctl "
    "history`). Exit status: 0 promoted or gates passed, 1 refused or rolled back, 2 could not start, "
    "3 rollback incomplete (the record names the steps that could not run; the next promotion of the "
    "model retries them first).",
    add_arguments=_add_arguments,
    run=run,
)
HISTORY = Command(
    name="history",
    help="list promotion records",
    description="List every promotion attempt with its gate results and decision.",
    add_arguments=_add_history_arguments,
    run=run_history,
)
