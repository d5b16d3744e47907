"""``inferctl up``: build what is missing, start Triton (supervised) and the gateway, print a first
request."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from inferctl.build_cmd import add_build_options, add_json_option, build_cache_dir, parse_weights
from inferctl.command import Command
from inferctl.up_secrets import SECRETS_FILE, load_or_create_secrets
from serving.console import heading, json_document, make_console, quiet_library_progress
from serving.gateway_process import GatewayLaunch
from serving.processes import ManagedProcess, ProcessStartError

STATE_DIR = Path(".platform")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from builders.registry import DEFAULT_STACK
    from serving.launcher import TritonPorts

    parser.add_argument(
        "--models",
        nargs="+",
        default=list(DEFAULT_STACK),
        help="models to serve (default: %(default)s)",
    )
    add_build_options(parser)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address Triton and the gateway bind (default: %(default)s)",
    )
    for port, default in asdict(TritonPorts()).items():
        parser.add_argument(f"--triton-{port}-port", type=int, default=default)
    parser.add_argument("--gateway-port", type=int, default=8080)
    parser.add_argument(
        "--gateway-grpc-port",
        type=int,
        default=8081,
        help="the gateway's KServe v2 gRPC entry; 0 for none (default: %(default)s)",
    )
    parser.add_argument("--no-gateway", action="store_true", help="serve Triton alone")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=STATE_DIR,
        help="where the gateway's key store and secrets (secrets.env, mode 0600) live "
        "(default: %(default)s)",
    )
    add_json_option(parser, "the endpoints (and the first API key) once the platform is up")


def _generation_weights(
    args: argparse.Namespace, weights: dict[str, str], console: Console
) -> dict[str, str]:
    """``weights`` plus a tiny random-init Stable Diffusion checkpoint when a diffusion model is to be
    served and no checkpoint folder is named (``--weights stable_diffusion=PATH`` or ``SD_CHECKPOINT``).

    The folder is written once under the state directory and reused, so the build is reused too.
    """
    from builders.families import diffusion

    names = {
        diffusion.PIPELINE,
        diffusion.FP16_PIPELINE,
        diffusion.TORCH_PIPELINE,
        diffusion.TEXT_ENCODER,
        diffusion.UNET,
        diffusion.VAE_DECODER,
        "sd_unet_fp16",
    }
    if (
        not names & set(args.models)
        or names & set(weights)
        or os.environ.get(diffusion.CHECKPOINT_ENV)
    ):
        return weights
    folder = args.state_dir / "checkpoints" / "stable_diffusion-tiny-random"
    with _status(console, "writing a tiny random-init Stable Diffusion checkpoint"):
        diffusion.ensure_random_checkpoint(folder, "tiny", seed=0)
    console.print(
        f"[yellow]stable_diffusion: random weights[/yellow] (the tiny preset, {folder}): images are noise; "
        f"serve a real checkpoint with --weights {diffusion.PIPELINE}=PATH or {diffusion.CHECKPOINT_ENV}",
        soft_wrap=True,
    )
    return {**weights, diffusion.PIPELINE: str(folder)}


def _gateway(
    args: argparse.Namespace, triton_http: str, env: dict[str, str], ready_models: list[str]
) -> ManagedProcess:
    options = [
        "--host",
        args.host,
        "--port",
        str(args.gateway_port),
        "--triton-url",
        triton_http,
        "--keys-db",
        str(args.state_dir / "keys.sqlite3"),
        "--grpc-port",
        str(args.gateway_grpc_port),
    ]
    if ready_models:
        # /readyz then means: each model the user asked for is READY and answers a synthetic inference.
        options += ["--ready-models", ",".join(ready_models)]
    # Its log lines belong on this terminal: this is the foreground command the user watches.
    return GatewayLaunch(
        args.gateway_port,
        env,
        args=tuple(options),
        name="the gateway",
        inherit_output=True,
        host=args.host,
    ).process()


def _first_key(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    """A new all-models key when the store has none yet; ``None`` when keys already exist."""
    from gateway.settings import GatewaySettings
    from gateway.tenancy.key_stores import bootstrap_first_key
    from gateway.tenancy.keys_sqlite import SqliteKeyStore

    keys_db = args.state_dir / "keys.sqlite3"
    if keys_db.exists() and SqliteKeyStore(keys_db).list():
        return None
    # "standard" (100/min): enough to try every route by hand without meeting the free tier's 10/min.
    settings = GatewaySettings(keys_db=keys_db, admin_token=env["GATEWAY_ADMIN_TOKEN"])
    return bootstrap_first_key(settings, name="first-key", tier="standard")


#: the README's load-test example (loadtest/run.py's docstring): 16 users with 0.1-1 s of think time
#: send ~29 requests/s on average (no latency) over three models by the users' weights 3:3:2, ~650/min
#: for the busiest; the first key's "standard" tier allows 100/min per model and 300 per key, "premium"
#: 1,000 and 3,000: premium fits it (tests/inferctl/test_cli.py checks the sum).
LOAD_TEST_TIER = "premium"
LOAD_TEST_ARGS = "--scenarios classify,embeddings,v2 --users 16 --spawn-rate 4 --run-time 60s"


def _endpoints(args: argparse.Namespace, triton_http: str) -> list[dict[str, object]]:
    """What ``up`` serves, one record per server (the ``--json`` results)."""
    triton: dict[str, object] = {
        "service": "triton",
        "url": f"http://{triton_http}",
        "grpc": f"{args.host}:{args.triton_grpc_port}",
        "metrics": f"http://{args.host}:{args.triton_metrics_port}/metrics",
    }
    if args.no_gateway:
        return [triton]
    base = f"http://{args.host}:{args.gateway_port}"
    gateway: dict[str, object] = {
        "service": "gateway",
        "url": base,
        "docs": f"{base}/docs",
        "metrics": f"{base}/metrics",
        "grpc": f"{args.host}:{args.gateway_grpc_port}" if args.gateway_grpc_port else None,
        "keys_db": str(args.state_dir / "keys.sqlite3"),
        "secrets_file": str(args.state_dir / SECRETS_FILE),
    }
    return [triton, gateway]


def _print_welcome(
    console: Console, args: argparse.Namespace, triton_http: str, key: str | None
) -> None:
    heading(console, "[green]platform is up")
    console.print(
        f"Triton   http://{triton_http}  (gRPC {args.host}:{args.triton_grpc_port}, "
        f"metrics http://{args.host}:{args.triton_metrics_port}/metrics)"
    )
    if args.no_gateway:
        console.print(f"\ncurl http://{triton_http}/v2/models/efficientnet_lite0")
        return
    base = f"http://{args.host}:{args.gateway_port}"
    keys_db = args.state_dir / "keys.sqlite3"
    console.print(
        f"Gateway  {base}  (docs {base}/docs, metrics {base}/metrics with the metrics or admin token "
        "as bearer)"
    )
    if args.gateway_grpc_port:
        console.print(
            f"         KServe v2 gRPC {args.host}:{args.gateway_grpc_port} "
            "(tritonclient.grpc, metadata authorization: Bearer <key>)"
        )
    console.print(
        f"Admin token, JWT secret and metrics token in {args.state_dir / SECRETS_FILE} "
        "(mode 0600, reused by the next `up`; GATEWAY_ADMIN_TOKEN etc. override it)"
    )
    shown = key or "<your API key>"
    if key:
        console.print(
            f"\nYour first API key (tier standard; shown once, stored hashed): [bold]{key}[/bold]"
        )
    else:
        console.print(
            f"\nKeys already exist in {keys_db}; create one with "
            f"`python -m gateway keys create NAME --keys-db {keys_db}`"
        )
    console.print("\nClassify a photo:")
    console.print(
        f'  curl -s -H "Authorization: Bearer {shown}" -F "file=@photo.jpg" {base}/v1/classify',
        soft_wrap=True,
    )
    if "text_embedding" in args.models:
        console.print("\nEmbed a sentence (OpenAI-style):")
        console.print(
            f'  curl -s -H "Authorization: Bearer {shown}" -H "Content-Type: application/json" '
            f'-d \'{{"model": "text_embedding", "input": "hello world"}}\' {base}/v1/embeddings',
            soft_wrap=True,
        )
    console.print(
        f"\nLoad test (the first key's tier would answer most of it with 429): a {LOAD_TEST_TIER} "
        "key, then locust"
    )
    console.print(
        f"  python -m gateway keys create load-test --tier {LOAD_TEST_TIER} --keys-db {keys_db}",
        soft_wrap=True,
    )
    console.print(
        f"  LOADTEST_API_KEY=<that key> inferctl bench locust --host {base} {LOAD_TEST_ARGS}",
        soft_wrap=True,
    )
    if "stable_diffusion" in args.models:
        console.print(
            "\nGenerate an image (OpenAI-style; the answer's URL opens without the key until it expires):"
        )
        console.print(
            f'  curl -s -H "Authorization: Bearer {shown}" -H "Content-Type: application/json" '
            f'-d \'{{"prompt": "a red fox", "response_format": "url"}}\' {base}/v1/images/generations',
            soft_wrap=True,
        )
    console.print("\nPress Ctrl-C to stop.")


def _status(console: Console, message: str) -> AbstractContextManager[object]:
    """A spinner on a terminal; a log line elsewhere (a spinner in a log shows nothing)."""
    if console.is_terminal:
        return console.status(message)
    console.print(f"{message} ...", markup=False)
    return nullcontext()


def run(args: argparse.Namespace) -> int:
    from builders.engine_target import ServingTarget, engine_refusals
    from builders.errors import BuildError
    from builders.pipeline import BuildOptions, build, print_summary
    from builders.repository import discard_unfinished
    from serving.launcher import TritonPorts, TritonServer, TritonStartError
    from serving.supervisor import TritonSupervisor

    # With --json, stdout carries only the endpoints document; everything else goes to stderr.
    console, build_console = make_console(stderr=args.json), make_console(stderr=True)
    quiet_library_progress(build_console)
    # A version a promotion published but never finished is not production: Triton would load it
    # (it knows nothing of the marker), so it goes before anything starts.
    for folder in discard_unfinished(args.repository):
        console.print(f"removed {folder}: an unfinished promotion left it (see `inferctl history`)")
    try:
        weights = _generation_weights(args, parse_weights(args.weights), console)
        reports = build(
            args.models,
            BuildOptions(
                repository=args.repository,
                force=args.force,
                weights=weights,
                cache=build_cache_dir(args),
                int8_calibration_study=args.int8_calibration_study,
            ),
            console=build_console,
        )
    except BuildError as exc:
        console.print(f"[red]build failed:[/red] {exc}")
        return 1
    print_summary(reports, console)

    # Entries of the repository only (engines no Triton here loads are artifacts beside it), and no
    # engine the embedded server cannot load: it has no TensorRT backend. Each engine entry's own
    # engine.json says what it needs; those stay on disk for a GPU host.
    entries = sorted(
        {r.model for r in reports if (args.repository / r.model / "config.pbtxt").is_file()}
    )
    refused = engine_refusals(args.repository, ServingTarget.embedded(), entries)
    for name, reason in sorted(refused.items()):
        console.print(f"[yellow]{name} not served here:[/yellow] {reason}", soft_wrap=True)
    served = [name for name in entries if refused.get(name) is None]
    server = TritonServer(
        args.repository.resolve(),
        models=served,
        host=args.host,
        ports=TritonPorts(args.triton_http_port, args.triton_grpc_port, args.triton_metrics_port),
    )
    with _status(console, "starting Triton"):
        try:
            server.start()
        except TritonStartError as exc:
            console.print(f"[red]Triton did not start:[/red] {exc}")
            return 1
    supervisor = TritonSupervisor(server).start()
    gateway: ManagedProcess | None = None
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        key = None
        if not args.no_gateway:
            args.state_dir.mkdir(
                mode=0o700, parents=True, exist_ok=True
            )  # keys and secrets: owner only
            # Generated once and kept in a 0600 file: the gateway refuses to serve with none.
            env = dict(os.environ, **load_or_create_secrets(args.state_dir))
            key = _first_key(args, env)
            gateway = _gateway(
                args, server.http_url, env, [m for m in args.models if m in served]
            ).start()
            with _status(console, "starting the gateway"):
                gateway.wait_http(f"http://{args.host}:{args.gateway_port}/healthz", timeout_s=60)
        _print_welcome(console, args, server.http_url, key)
        if args.json:
            print(
                json_document("up", _endpoints(args, server.http_url), api_key=key, models=served),
                flush=True,
            )
        while not stopped.wait(0.5):
            if gateway is not None and not gateway.running():
                console.print(f"[red]the gateway exited with code {gateway.returncode}[/red]")
                return 1
    except KeyboardInterrupt:
        pass
    except ProcessStartError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    finally:
        if gateway is not None:
            gateway.stop()
        supervisor.stop()
        console.print("stopped")
    return 0


COMMAND = Command(
    name="up",
    help="build the default models and start Triton + the gateway",
    description="Build what is missing, start the embedded Triton server (restarted if it crashes) "
    "and the gateway in front of it, create a first API key and print a ready-to-paste request. "
    "Runs in the foreground until Ctrl-C.",
    add_arguments=_add_arguments,
    run=run,
)
