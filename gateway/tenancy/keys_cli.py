"""``python -m gateway keys ...``: manage API keys in the configured store, without a running gateway.

The store is the one the gateway would use with the same settings: Redis when ``--redis-url`` (or
``GATEWAY_REDIS_URL``) is set, else the SQLite file ``--keys-db`` (``GATEWAY_KEYS_DB``). Migrating
a deployment from SQLite to Redis keeps every key working::

    python -m gateway keys export --keys-db gateway_keys.sqlite3 -o keys.json
    python -m gateway keys import keys.json --redis-url redis://redis:6379/0

(``keys.json`` holds hashes, never plaintext keys; it is also the body ``POST /admin/keys/import``
takes.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from gateway.settings import GatewaySettings
from gateway.tenancy.key_protocol import KeyExport
from gateway.tenancy.key_stores import open_key_store
from gateway.tenancy.keys import (
    ALL_MODELS,
    KeyConflict,
    KeyStore,
    KeyStoreUnavailable,
    records_from_export,
)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``keys`` subcommands and the store options they share."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway keys",
        description="Manage API keys in the gateway's store (Redis when a Redis URL is set, else SQLite).",
    )
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--keys-db", type=Path, help="SQLite key file (env GATEWAY_KEYS_DB)")
    store.add_argument("--redis-url", help="use the Redis store instead (env GATEWAY_REDIS_URL)")
    store.add_argument(
        "--redis-prefix", help="Redis key namespace (env GATEWAY_REDIS_PREFIX, default gw:)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", parents=[store], help="create a key and print it once")
    create.add_argument("name")
    create.add_argument(
        "--scope", action="append", dest="scopes", help="a model name (repeat); default: all"
    )
    create.add_argument("--tier", help="rate-limit tier (default: GATEWAY_DEFAULT_TIER)")
    commands.add_parser("list", parents=[store], help="list keys as JSON (never secrets or hashes)")
    export = commands.add_parser(
        "export", parents=[store], help="write every key (hash and metadata, no plaintext) as JSON"
    )
    export.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    load = commands.add_parser(
        "import",
        parents=[store],
        help="add the keys of an export (all or nothing; identical keys already present are skipped)",
    )
    load.add_argument("file", help="an export document, or - for stdin")
    return parser


def _settings(args: argparse.Namespace) -> GatewaySettings:
    overrides = {
        name: getattr(args, name)
        for name in ("keys_db", "redis_url", "redis_prefix")
        if getattr(args, name, None) is not None
    }
    return GatewaySettings(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``keys`` subcommand.

    Returns:
        0 on success, 1 when the store refused (conflict, unreachable), 2 on bad input.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = _settings(args)
    store = open_key_store(settings)
    try:
        if args.command == "create":
            tier = args.tier or settings.default_tier
            if tier not in settings.tier_limits:
                parser.error(
                    f"unknown tier '{tier}' (known: {', '.join(sorted(settings.tier_limits))})"
                )
            _, plaintext = store.create(args.name, args.scopes or [ALL_MODELS], tier)
            print(plaintext)
        elif args.command == "list":
            keys = [
                {k: v for k, v in r.as_export().items() if k != "key_hash"} for r in store.list()
            ]
            print(json.dumps(keys, indent=2))
        elif args.command == "export":
            records = store.list()
            document = json.dumps({"keys": [r.as_export() for r in records]}, indent=2) + "\n"
            if args.output:
                args.output.write_text(document)
                print(f"exported {len(records)} keys to {args.output}", file=sys.stderr)
            else:
                sys.stdout.write(document)
        else:
            return _import(parser, args, settings, store)
    except KeyStoreUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


def _import(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    settings: GatewaySettings,
    store: KeyStore,
) -> int:
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        document = KeyExport.model_validate_json(text)
    except ValidationError as exc:
        parser.error(
            f"{args.file} is not a key export: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        )
    unknown = sorted({k.tier for k in document.keys} - set(settings.tier_limits))
    if unknown:
        parser.error(
            f"unknown tier(s) {', '.join(unknown)}: configure them in GATEWAY_TIER_LIMITS first"
        )
    try:
        result = store.import_records(records_from_export(k.model_dump() for k in document.keys))
    except ValueError as exc:
        parser.error(str(exc))
    except KeyConflict as exc:
        print(f"error: nothing imported: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"imported": result.imported, "skipped": result.skipped}))
    return 0
