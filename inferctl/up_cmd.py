"""``inferctl up``: build what is missing, start Triton (supervised) and the gateway, print a first request."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console

from inferctl.build_cmd import add_build_options, parse_weights

STATE_DIR = Path(".platform")


def register(sub: argparse._SubParsersAction) -> None:
    from builders.registry import DEFAULT_MODELS

    parser = sub.add_parser(
        "up",
        help="build the default models and start Triton + the gateway",
        description="Build what is missing, start the embedded Triton server (restarted if it crashes) "
        "and the gateway in front of it, create a first API key and print a ready-to-paste request. "
        "Runs in the foreground until Ctrl-C.",
    )
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="models to serve (default: %(default)s)")
    add_build_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address Triton and the gateway bind (default: %(default)s)")
    parser.add_argument("--triton-http-port", type=int, default=8000)
    parser.add_argument("--triton-grpc-port", type=int, default=8001)
    parser.add_argument("--triton-metrics-port", type=int, default=8002)
    parser.add_argument("--gateway-port", type=int, default=8080)
    parser.add_argument("--no-gateway", action="store_true", help="serve Triton alone")
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR,
                        help="where the gateway's key store and admin token live (default: %(default)s)")
    parser.set_defaults(handler=run)


def _admin_token(state_dir: Path) -> str:
    """The admin credential: from GATEWAY_ADMIN_TOKEN, else generated once and kept owner-readable only."""
    if os.environ.get("GATEWAY_ADMIN_TOKEN"):
        return os.environ["GATEWAY_ADMIN_TOKEN"]
    path = state_dir / "admin_token"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    raise RuntimeError(f"the gateway did not answer {url} within {timeout_s:.0f} s")


def _start_gateway(args: argparse.Namespace, triton_http: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gateway", "--host", args.host, "--port", str(args.gateway_port),
               "--triton-url", triton_http, "--keys-db", str(args.state_dir / "keys.sqlite3")]
    return subprocess.Popen(command, env=env, start_new_session=True)


def _first_key(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    """A new all-models key when the store has none yet; ``None`` when keys already exist."""
    from gateway.keys import KeyStore, bootstrap_first_key
    from gateway.settings import GatewaySettings

    keys_db = args.state_dir / "keys.sqlite3"
    if keys_db.exists() and KeyStore(keys_db).list():
        return None
    # "standard" (100/min): enough to try every route by hand without meeting the free tier's 10/min.
    settings = GatewaySettings(keys_db=keys_db, admin_token=env["GATEWAY_ADMIN_TOKEN"])
    return bootstrap_first_key(settings, name="first-key", tier="standard")


def _print_welcome(console: Console, args: argparse.Namespace, triton_http: str, key: str | None) -> None:
    console.rule("[green]platform is up")
    console.print(f"Triton   http://{triton_http}  (gRPC {args.host}:{args.triton_grpc_port}, "
                  f"metrics http://{args.host}:{args.triton_metrics_port}/metrics)")
    if args.no_gateway:
        console.print(f"\ncurl http://{triton_http}/v2/models/efficientnet_lite0")
        return
    base = f"http://{args.host}:{args.gateway_port}"
    console.print(f"Gateway  {base}  (docs {base}/docs, metrics {base}/metrics)")
    console.print(f"Admin token in {args.state_dir / 'admin_token'} (or GATEWAY_ADMIN_TOKEN)")
    shown = key or "<your API key>"
    if key:
        console.print(f"\nYour first API key (shown once, stored hashed): [bold]{key}[/bold]")
    else:
        console.print(f"\nKeys already exist in {args.state_dir / 'keys.sqlite3'}; create one with "
                      f"`python -m gateway --keys-db {args.state_dir / 'keys.sqlite3'} --create-key NAME`")
    console.print("\nClassify a photo:")
    console.print(f'  curl -s -H "Authorization: Bearer {shown}" -F "file=@photo.jpg" {base}/v1/classify', soft_wrap=True)
    if "text_embedding" in args.models:
        console.print("\nEmbed a sentence (OpenAI-style):")
        console.print(f'  curl -s -H "Authorization: Bearer {shown}" -H "Content-Type: application/json" '
                      f"-d '{{\"model\": \"text_embedding\", \"input\": \"hello world\"}}' {base}/v1/embeddings",
                      soft_wrap=True)
    console.print("\nPress Ctrl-C to stop.")


def run(args: argparse.Namespace) -> int:
    from builders.errors import BuildError
    from builders.pipeline import BuildOptions, build, print_summary
    from serving.launcher import TritonPorts, TritonServer, TritonStartError
    from serving.supervisor import TritonSupervisor

    console = Console()
    try:
        reports = build(args.models, BuildOptions(repository=args.repository, force=args.force,
                                                  weights=parse_weights(args.weights)), console=Console(stderr=True))
    except BuildError as exc:
        console.print(f"[red]build failed:[/red] {exc}")
        return 1
    print_summary(reports, console)

    served = sorted({r.model for r in reports} - {r.model for r in reports if "trt" in r.model})
    server = TritonServer(args.repository.resolve(), models=served, host=args.host,
                          ports=TritonPorts(args.triton_http_port, args.triton_grpc_port, args.triton_metrics_port))
    with console.status("starting Triton"):
        try:
            server.start()
        except TritonStartError as exc:
            console.print(f"[red]Triton did not start:[/red] {exc}")
            return 1
    supervisor = TritonSupervisor(server).start()
    gateway: subprocess.Popen[bytes] | None = None
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        key = None
        if not args.no_gateway:
            args.state_dir.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ, GATEWAY_ADMIN_TOKEN=_admin_token(args.state_dir))
            key = _first_key(args, env)
            gateway = _start_gateway(args, server.http_url, env)
            with console.status("starting the gateway"):
                _wait_http(f"http://{args.host}:{args.gateway_port}/healthz", gateway)
        _print_welcome(console, args, server.http_url, key)
        while not stopped.wait(0.5):
            if gateway is not None and gateway.poll() is not None:
                console.print(f"[red]the gateway exited with code {gateway.returncode}[/red]")
                return 1
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    finally:
        if gateway is not None and gateway.poll() is None:
            os.killpg(gateway.pid, signal.SIGTERM)
            gateway.wait(timeout=15)
        supervisor.stop()
        console.print("stopped")
    return 0
