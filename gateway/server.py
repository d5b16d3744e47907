"""Run the gateway under uvicorn: ``serve(settings)`` and the ``python -m gateway`` CLI."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from gateway.settings import GatewaySettings, RedisFailurePolicy

__all__ = ["build_parser", "main", "serve"]


def serve(settings: GatewaySettings) -> None:
    """Serve the gateway until interrupted (blocks).

    Args:
        settings: configuration; ``host`` and ``port`` say where to listen.
    """
    import uvicorn

    from gateway.app import create_app

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # uvicorn's access log would duplicate ours (which carries client id and model, never secrets).
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def build_parser() -> argparse.ArgumentParser:
    """The CLI's options; each one overrides the matching ``GATEWAY_*`` environment variable."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description=(
            "Run the inference gateway (auth, rate limits, latency stats) in front of Triton. Every option "
            "also reads from an environment variable GATEWAY_<OPTION> (e.g. GATEWAY_TRITON_HTTP_URL); "
            "options given here win."
        ),
    )
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to bind (default 8080)")
    parser.add_argument(
        "--triton-url", dest="triton_http_url", help="Triton HTTP host:port (default 127.0.0.1:8000)"
    )
    parser.add_argument(
        "--keys-db", type=Path, help="SQLite file of API keys (default ./gateway_keys.sqlite3)"
    )
    parser.add_argument(
        "--redis-url", help="redis://host:port/db for shared rate limits (default: in process)"
    )
    parser.add_argument(
        "--redis-failure-policy",
        choices=[p.value for p in RedisFailurePolicy],
        help="when Redis is down: admit (open) or refuse (closed)",
    )
    parser.add_argument("--max-body-bytes", type=int, help="largest accepted request body")
    parser.add_argument(
        "--max-in-flight-per-model", type=int, help="concurrent requests per model before 429"
    )
    parser.add_argument("--upstream-timeout-s", type=float, help="per-request Triton deadline (504 after it)")
    parser.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument(
        "--create-key",
        metavar="NAME",
        help="create an all-models API key with this name, print it once, and exit",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point.

    Returns:
        The process exit code.
    """
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "create_key"}
    settings = GatewaySettings(**overrides)
    if args.create_key:
        from gateway.keys import bootstrap_first_key

        print(bootstrap_first_key(settings, name=args.create_key))
        return 0
    serve(settings)
    return 0
