"""Run the gateway under uvicorn: ``serve(settings)`` and the ``python -m gateway`` CLI.

One process, or ``workers`` processes, each with a listening socket of its own where the kernel
spreads connections over them (:mod:`gateway.http.workers`; uvicorn's supervisor restarts a worker
that dies). Several workers need Redis: that is where they share API keys, canary weights
and rate limits (see :meth:`GatewaySettings.worker_count`). Workers read their settings from the
environment, so ``serve`` writes the effective settings there before it starts them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from gateway.backends.triton_settings import TritonProtocol
from gateway.http.connection_settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_REQUESTS_PER_CONNECTION,
)
from gateway.settings import GatewaySettings
from gateway.tenancy.settings import RedisFailurePolicy

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["build_parser", "main", "serve", "settings_environment", "worker_app"]

log = logging.getLogger(__name__)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def settings_environment(settings: GatewaySettings) -> dict[str, str]:
    """``GATEWAY_*`` variables that rebuild exactly ``settings`` (secrets included) in another process."""
    env = {}
    for name, value in settings.model_dump(mode="json").items():
        raw = getattr(settings, name)
        if raw is None:
            continue  # unset: the field's default (None) applies in the other process too
        if isinstance(raw, SecretStr):
            value = raw.get_secret_value()
        env[f"GATEWAY_{name.upper()}"] = (
            json.dumps(value) if isinstance(value, dict | list) else str(value)
        )
    return env


def _serving_app(settings: GatewaySettings) -> FastAPI:
    """The app a serving process runs (one worker, or each of several)."""
    from gateway.app import create_app
    from gateway.observe.gc_pauses import freeze_startup_objects

    app = create_app(settings)
    if settings.gc_freeze:
        # What is alive once the app is built lives as long as the worker: the collector need not
        # walk it in every full collection (56-68 ms on a 2-core EPYC; gateway.observe.gc_pauses).
        freeze_startup_objects()
    return app


def worker_app() -> FastAPI:
    """The app of one worker process, from ``GATEWAY_*`` (uvicorn calls this in each worker)."""
    settings = GatewaySettings()
    _configure_logging(settings.log_level)
    return _serving_app(settings)


def serve(settings: GatewaySettings) -> None:
    """Serve the gateway until interrupted (blocks).

    Args:
        settings: configuration; ``host`` and ``port`` say where to listen, ``workers`` how many
            processes (see :meth:`GatewaySettings.worker_count`).

    Raises:
        ValueError: several workers asked for without Redis.
        InsecureSecrets: a placeholder, weak or missing secret, without ``dev_insecure``.
    """
    import uvicorn

    from gateway.http.limits import uvicorn_options
    from gateway.http.server_limits import ServerLimits
    from gateway.http.workers import serve_workers
    from gateway.observe.metrics import metrics_directory
    from gateway.tenancy.secret_policy import check_secrets

    _configure_logging(settings.log_level)
    check_secrets(settings)
    workers = settings.worker_count()
    log.info(
        "gateway: %d worker process%s, state %s, Triton over %s",
        workers,
        "" if workers == 1 else "es",
        "shared through Redis" if settings.shared else "in this process (SQLite keys)",
        settings.triton_protocol.value,
    )
    # uvicorn's access log would duplicate ours (which carries client id and model, never secrets).
    common = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        **uvicorn_options(ServerLimits.from_settings(settings)),
    )
    if workers == 1:
        uvicorn.run(_serving_app(settings), **common)  # type: ignore[arg-type]
        return
    # Workers are fresh interpreters: hand them the effective settings (CLI options included), and
    # name the protocol class by import path (the class bound to limits cannot be pickled to them).
    env = settings_environment(settings)
    for name in [n for n in os.environ if n.startswith("GATEWAY_") and n not in env]:
        del os.environ[name]  # a value the settings do not hold (e.g. a field left unset)
    os.environ.update(env)
    common["http"] = f"{__name__}:{_WORKER_HTTP_PROTOCOL}"
    # Prometheus values of every worker in one folder, so any worker answers /metrics for all.
    with metrics_directory(workers):
        serve_workers(
            uvicorn.Config(
                "gateway.http.server:worker_app", factory=True, workers=workers, **common
            )  # type: ignore[arg-type]
        )


_WORKER_HTTP_PROTOCOL = "WorkerHttpProtocol"


def __getattr__(name: str) -> Any:
    # uvicorn imports the worker's HTTP protocol class by name inside each worker: bind it to the
    # limits of that worker's settings (read from the environment ``serve`` prepared) only then.
    if name == _WORKER_HTTP_PROTOCOL:
        from gateway.http.limits import LimitedHttpToolsProtocol
        from gateway.http.server_limits import ServerLimits

        return LimitedHttpToolsProtocol.with_limits(ServerLimits.from_settings(GatewaySettings()))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: the CLI's options for the connection and request limits: (flag, type, help)
_LIMIT_OPTIONS: tuple[tuple[str, type, str], ...] = (
    ("--max-body-bytes", int, "largest accepted request body (also once decompressed)"),
    (
        "--max-header-bytes",
        int,
        f"largest request line plus headers (431 past it; default {DEFAULT_MAX_HEADER_BYTES})",
    ),
    (
        "--max-header-count",
        int,
        f"most header fields per request (431 past it; default {DEFAULT_MAX_HEADER_COUNT})",
    ),
    (
        "--header-timeout-s",
        float,
        "seconds for a request's line and headers to arrive (408 after it; default "
        f"{DEFAULT_HEADER_TIMEOUT_S:g})",
    ),
    (
        "--body-timeout-s",
        float,
        "seconds for a body to arrive once the headers have (408 after it; default "
        f"{DEFAULT_BODY_TIMEOUT_S:g})",
    ),
    (
        "--max-connections",
        int,
        f"open connections; past it the longest idle one is closed, or a new one gets 429 when none is "
        f"idle (default {DEFAULT_MAX_CONNECTIONS})",
    ),
    (
        "--max-connections-per-peer",
        int,
        "open connections from one peer address; past it that address's longest idle one is closed, or a "
        f"new one gets 429 when none is idle (default {DEFAULT_MAX_CONNECTIONS_PER_PEER}; behind a "
        "proxy, raise it to --max-connections)",
    ),
    (
        "--keep-alive-timeout-s",
        float,
        f"seconds an idle keep-alive connection stays open (default {DEFAULT_KEEP_ALIVE_TIMEOUT_S:g})",
    ),
    (
        "--max-requests-per-connection",
        int,
        f"requests on one connection before it is closed (default {DEFAULT_MAX_REQUESTS_PER_CONNECTION})",
    ),
    ("--max-in-flight-per-model", int, "concurrent requests per model and worker before 429"),
)


def build_parser() -> argparse.ArgumentParser:
    """The CLI's options; each one overrides the matching ``GATEWAY_*`` environment variable."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description=(
            "Run the inference gateway (auth, rate limits, latency stats) in front of Triton. Every option "
            "also reads from an environment variable GATEWAY_<OPTION> (e.g. GATEWAY_TRITON_HTTP_URL); "
            "options given here win. `python -m gateway keys --help` manages API keys (create, export, "
            "import)."
        ),
    )
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to bind (default 8080)")
    parser.add_argument(
        "--workers",
        type=int,
        help="gateway processes sharing the port (default 0 = automatic: one per usable core when "
        "--redis-url is set, else 1; more than 1 needs Redis, where workers share keys, canary weights "
        "and rate limits)",
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        help="port of the KServe v2 gRPC entry on the same host (default 0: none)",
    )
    parser.add_argument(
        "--triton-url",
        dest="triton_http_url",
        help="Triton HTTP host:port (default 127.0.0.1:8000)",
    )
    parser.add_argument("--triton-grpc-url", help="Triton gRPC host:port (default 127.0.0.1:8001)")
    parser.add_argument(
        "--triton-protocol",
        choices=[p.value for p in TritonProtocol],
        help="gateway -> Triton transport (default http)",
    )
    parser.add_argument(
        "--keys-db",
        type=Path,
        help="SQLite file of API keys when no Redis is set (default ./gateway_keys.sqlite3)",
    )
    parser.add_argument(
        "--redis-url",
        help="redis://host:port/db shared by replicas and workers: API keys, canary weights, rate limits "
        "(default: none, SQLite keys and in-process state)",
    )
    parser.add_argument(
        "--redis-failure-policy",
        choices=[p.value for p in RedisFailurePolicy],
        help="when Redis is down: admit (open) or refuse (closed)",
    )
    for flag, kind, text in _LIMIT_OPTIONS:
        parser.add_argument(flag, type=kind, help=text)
    parser.add_argument(
        "--ready-models",
        help="comma-separated Triton models /readyz requires (each READY and passing one synthetic "
        "inference; default: none, /readyz follows Triton's server readiness)",
    )
    parser.add_argument(
        "--upstream-timeout-s", type=float, help="per-request Triton deadline (504 after it)"
    )
    parser.add_argument(
        "--job-workers",
        type=int,
        help="generation jobs each gateway process runs at once (default 1; 0: accept and serve "
        "jobs, run none); callbacks: GATEWAY_CALLBACK_ALLOW and GATEWAY_CALLBACK_SECRET",
    )
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
    args_list = list(argv) if argv is not None else None
    if args_list is None:
        import sys

        args_list = sys.argv[1:]
    if args_list[:1] == ["keys"]:
        from gateway.tenancy.keys_cli import main as keys_main

        return keys_main(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "create_key"}
    settings = GatewaySettings(**overrides)
    if args.create_key:
        from gateway.tenancy.key_stores import bootstrap_first_key

        print(bootstrap_first_key(settings, name=args.create_key))
        return 0
    from gateway.tenancy.secret_policy import InsecureSecrets

    try:
        settings.worker_count()
    except ValueError as exc:
        parser.error(str(exc))
    try:
        serve(settings)
    except InsecureSecrets as exc:
        parser.error(str(exc))
    return 0
