"""The ``keydispenser`` command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import yaml
from pydantic import SecretStr, ValidationError

from shared import logs
from shared.apikeys import config_entry, new_api_key
from shared.cold_store import ColdStore
from shared.databases import ensure_database
from shared.errors import ConfigError, KeydispenserError
from shared.hot_store import HotStore
from shared.idtypes import build_id_types
from shared.schema import migrate
from shared.settings import Settings, describe, load_settings

log = logging.getLogger(__name__)
PROCESSES = ("keygen", "keysync", "dispenser")
BENCHMARKS = {
    "keygen": "keygen.bench",
    "fence": "dispenser.bench",
    "dispense": "dispenser.bench_dispense",
}
_STATUS_CAP = 10_000_000


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="keydispenser", description=__doc__)
    top.add_argument("--config", help="YAML configuration file (default: $KD_CONFIG or built-in)")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("migrate", help="create or update the schema (idempotent)")
    for name in PROCESSES:
        commands.add_parser(name, help=f"run a {name} process")
    status = commands.add_parser("status", help="inventory and keyspace headroom per type")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    fill = commands.add_parser("fill", help="pre-fill the cold inventory of one type")
    fill.add_argument("--type", required=True, dest="id_type", help="ID type name")
    fill.add_argument("--count", required=True, type=_positive, help="keys to add (at least)")
    bench = commands.add_parser("bench", help="measure throughput; writes JSON results")
    bench.add_argument("target", choices=BENCHMARKS, help="what to measure")
    bench.add_argument("--json", metavar="PATH", help="also write the results to this file")
    bench.add_argument("--seconds", type=float, default=3.0, help="duration of each measure")
    bench.add_argument(
        "--load",
        choices=("auto", "wrk", "bundled"),
        default="auto",
        help="dispense: load generator (auto: wrk when installed)",
    )
    drill = commands.add_parser("drill", help="failover drill on loopback: Sentinel, faults, load")
    drill.add_argument("--rounds", type=_positive, default=20, help="fault rounds")
    drill.add_argument("--faults", help="comma-separated fault kinds (default: all, in turn)")
    drill.add_argument("--json", metavar="PATH", help="also write the report to this file")
    drill.add_argument("--work-dir", help="keep servers' data and logs here")
    apikey = commands.add_parser("apikey", help="create an API key; prints its config entry")
    apikey.add_argument("--name", required=True, help="client name (letters, digits, _ . -)")
    apikey.add_argument("--types", help="comma-separated ID types it may use (default: all)")
    apikey.add_argument("--rate", type=float, help="requests per second (default: unlimited)")
    up = commands.add_parser("up", help="the whole stack on this machine, embedded servers")
    up.add_argument("--data-dir", default=".keydispenser", help="where embedded servers keep data")
    up.add_argument("--port", type=int, default=8080, help="dispenser HTTP port")
    up.add_argument("--postgres-dsn", help="use this PostgreSQL instead of an embedded one")
    up.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    return top


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
        if args.config:  # worker processes (dispenser.workers > 1) read the same file
            os.environ["KD_CONFIG"] = str(Path(args.config).resolve())
        logs.configure(args.command, settings.log_level)
        _dispatch(args, settings)
    except ConfigError as exc:
        print(f"keydispenser: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeydispenserError as exc:
        print(f"keydispenser: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


def _dispatch(args: argparse.Namespace, settings: Settings) -> None:
    if args.command in PROCESSES:
        # Imported by name: the process packages never import one another.
        importlib.import_module(f"{args.command}.main").main(settings)
    elif args.command == "migrate":
        version = asyncio.run(run_migrate(settings))
        print(f"schema at version {version}; id types: {', '.join(sorted(settings.id_types))}")
    elif args.command == "status":
        report = asyncio.run(collect_status(settings))
        print(json.dumps(report, indent=2) if args.json else format_status(report))
    elif args.command == "fill":
        importlib.import_module("keygen.fill").main(settings, args.id_type, args.count)
    elif args.command == "bench":
        module = importlib.import_module(BENCHMARKS[args.target])
        options = {"load": args.load} if args.target == "dispense" else {}
        results = asyncio.run(
            module.run(settings.model_copy(update=_bench_key(settings)), args.seconds, **options)
        )
        print(json.dumps(results, indent=2))
        _write_json(results, args.json)
    elif args.command == "drill":
        _drill(settings, args)
    elif args.command == "apikey":
        _apikey(settings, args)
    elif args.command == "up":
        from shared.up import up

        up(settings, args)


def _drill(settings: Settings, args: argparse.Namespace) -> None:
    from shared.drill.runner import format_table, run

    only = [f.strip() for f in args.faults.split(",")] if args.faults else None
    work = Path(args.work_dir).resolve() if args.work_dir else None
    report = asyncio.run(run(settings, args.rounds, only, work))
    _write_json(report, args.json)
    print(format_table(report))
    if report["duplicates"]:
        raise KeydispenserError(f"{report['duplicates']} keys were dispensed twice")
    if report["ledger"]["duplicate_alarms"]:
        raise KeydispenserError("the ledger raised its duplicate alarm")


def _apikey(settings: Settings, args: argparse.Namespace) -> None:
    types = [t.strip() for t in args.types.split(",")] if args.types else None
    key, key_digest = new_api_key()
    entry = config_entry(args.name, key_digest, types, args.rate)
    # Validate the entry as the dispenser will, so a bad name or type fails here.
    auth = {"api_keys": [*settings.dispenser.auth.api_keys, *yaml.safe_load(entry)]}
    try:
        Settings.model_validate(
            settings.model_dump() | {"dispenser": settings.dispenser.model_dump() | {"auth": auth}}
        )
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from exc
    print(f"API key (shown once; give it to the client '{args.name}'):\n  {key}\n")
    print("Add to dispenser.auth.api_keys in the configuration:")
    print(entry, end="")


def _write_json(report: dict[str, Any], path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2) + "\n")


def _positive(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {raw!r}")
    return int(raw)


def _bench_key(settings: Settings) -> dict[str, Any]:
    """Benchmarks generate into scratch databases: any key will do when none is set."""
    if settings.permutation_key is not None:
        return {}
    return {"permutation_key": SecretStr("keydispenser-benchmark-key")}


async def run_migrate(settings: Settings) -> int:
    id_types = build_id_types(settings)
    try:
        await ensure_database(settings.postgres_dsn)
        conn = await asyncpg.connect(settings.postgres_dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        raise KeydispenserError(f"postgres_dsn: cannot connect: {exc}") from exc
    try:
        return await migrate(conn, id_types)
    finally:
        await conn.close()


async def collect_status(settings: Settings) -> dict[str, Any]:
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = HotStore.from_settings(settings)
    report: dict[str, Any] = {}
    try:
        for name, id_type in build_id_types(settings, generating=False).items():
            state = await cold.sequence_state(id_type)
            ranges = await cold.range_stats(name)
            rate = ranges["accepted"] / ranges["candidates"] if ranges["candidates"] else None
            report[name] = {
                "hot_depth": await hot.depth(name),
                "cold_depth": await cold.depth(name, _STATUS_CAP),
                "ranges_leased": ranges["leased"],
                "ranges_filled": ranges["filled"],
                "counters_leased": state.leased_counters,
                "counters_headroom": state.headroom,
                "headroom_fraction": state.headroom / state.domain,
                "acceptance_rate": rate,
                "estimated_keys_left": None if rate is None else int(state.headroom * rate),
            }
    finally:
        await cold.close()
        await hot.close()
    return report


def format_status(report: dict[str, Any]) -> str:
    columns = ("hot_depth", "cold_depth", "ranges_leased", "ranges_filled", "counters_headroom")
    lines = ["id_type".ljust(16) + "".join(c.rjust(20) for c in (*columns, "headroom_%"))]
    for name, row in report.items():
        cells = [str(row[c]) for c in columns] + [f"{100 * row['headroom_fraction']:.4f}"]
        lines.append(name.ljust(16) + "".join(cell.rjust(20) for cell in cells))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
