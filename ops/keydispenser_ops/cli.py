"""The operator tooling's commands: ``up``, ``fill``, ``bench``, ``drill`` and ``simulate``.

Each is a ``Command`` (shared/cli/plugins.py) declared as an entry point of the group
``keydispenser.commands`` in this distribution's pyproject.toml (``keydispenser-ops``):
the runtime's command line finds them there and names none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keydispenser_ops.catalog import BENCHES
from shared import logs
from shared.cli.plugins import Command
from shared.domain.config import Settings
from shared.domain.errors import ConfigError, KeydispenserError

if TYPE_CHECKING:
    from keydispenser_ops.drill.report import Report


def run_fill(settings: Settings, args: argparse.Namespace) -> None:
    from keydispenser_ops.fill import main

    main(settings, args.name, args.count)


def run_bench(settings: Settings, args: argparse.Namespace) -> None:
    from keydispenser_ops.bench import Options, run

    defaults = Options()
    servers = getattr(args, "servers", None)
    options = Options(
        getattr(args, "load", defaults.load),
        tuple(getattr(args, "processes", defaults.processes)),
        getattr(args, "sync_batch", defaults.sync_batch),
        getattr(args, "keysyncs", defaults.keysyncs),
        tuple(n.strip() for n in servers.split(",")) if servers else defaults.servers,
        getattr(args, "rate", defaults.rate),
        getattr(args, "redis_cluster", defaults.cluster_shards),
        getattr(args, "slot_per", defaults.slot_per),
        getattr(args, "types", defaults.types),
        getattr(args, "existing_rows", defaults.existing_rows),
        getattr(args, "spent", defaults.spent),
        getattr(args, "rounds", defaults.rounds),
        getattr(args, "rows", defaults.rows),
    )
    if options.slot_per != "namespace" and not options.cluster_shards:
        raise ConfigError("--slot-per: with --redis-cluster only")
    results = asyncio.run(run(args.bench, settings, args.seconds, options))
    print(json.dumps(results, indent=2))
    write_json(results, args.json)


# The drill's flags that belong to one topology, and their default (anything else set
# with the other topology is refused, naming the flag).
DRILL_TOPOLOGY_FLAGS = {
    "slot_per": ("cluster", "--slot-per", "namespace"),
    "no_postgres_fence": ("sentinel", "--no-postgres-fence", False),
    "no_lease_wait": ("sentinel", "--no-lease-wait", False),
    "postgres": ("sentinel", "--postgres", "pair"),
}


def run_drill(settings: Settings, args: argparse.Namespace) -> None:
    """``drill --redis sentinel|cluster``: one command, the topology a parameter; the
    report (Report) is written, shown and judged the same way for both."""
    from keydispenser_ops.drill import fault_kinds

    for attr, (topology, flag, default) in DRILL_TOPOLOGY_FLAGS.items():
        if args.redis != topology and getattr(args, attr) != default:
            raise ConfigError(f"{flag}: with --redis {topology} only")
    if args.synchronous_mode and args.postgres != "patroni":
        raise ConfigError("--synchronous-mode: with --postgres patroni only")
    only = [f.strip() for f in args.faults.split(",")] if args.faults else None
    fault_kinds.chosen(args.redis, only, args.postgres)  # before any server starts
    work = Path(args.work_dir).resolve() if args.work_dir else None
    if args.redis == "cluster":
        from keydispenser_ops.drill import cluster

        shard_report = asyncio.run(cluster.run(settings, args.rounds, only, work, args.slot_per))
        report: Report = shard_report
        table = cluster.format_table(shard_report)
    else:
        from keydispenser_ops.drill import runner

        sentinel_report = asyncio.run(
            runner.run(
                settings,
                args.rounds,
                only,
                work,
                postgres_fence=not args.no_postgres_fence,
                lease_wait=not args.no_lease_wait,
                stack=runner.Stack(args.postgres, args.synchronous_mode),
            )
        )
        report, table = sentinel_report, runner.format_table(sentinel_report)
    write_json(report.as_json(), args.json)
    print(table)
    if failures := report.failures():
        raise KeydispenserError("the drill failed: " + "; ".join(failures))


def run_up(settings: Settings, args: argparse.Namespace) -> None:
    from keydispenser_ops.up import up

    if "KD_LOG_FORMAT" not in os.environ and sys.stderr.isatty():
        # A person at a terminal: one readable line per event (for up and its children).
        settings = settings.model_copy(update={"log_format": "console"})
        logs.configure("up", settings.log_level, settings.log_levels, settings.log_format)
    up(settings, args)


def _add_fill(fill: argparse.ArgumentParser) -> None:
    fill.add_argument("--type", required=True, dest="name", metavar="ID_TYPE", help="ID type name")
    fill.add_argument("--count", required=True, type=positive_int, help="keys to add (at least)")


def _add_bench(bench: argparse.ArgumentParser) -> None:
    which = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, what in BENCHES.items():
        one = which.add_parser(name, help=what, description=what)
        one.add_argument("--json", metavar="PATH", help="also write the results to this file")
        one.add_argument("--seconds", type=float, default=3.0, help="duration of each measure")
        for add in BENCH_OPTIONS.get(name, ()):
            add(one)


def _load_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--load",
        choices=("auto", "wrk", "bundled"),
        default="auto",
        help="the load generator (auto: wrk when installed)",
    )


def _servers_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--servers",
        default="uvicorn,granian",
        help="HTTP servers measured (uvicorn always; granian for bare and single)",
    )


def _rounds_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="make each measure this many times and keep the best (by requests/s)",
    )


def _processes_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--processes",
        type=positive_int,
        nargs="+",
        default=[1, 2],
        help="the numbers of keysync processes to measure",
    )


def _sync_batch_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--sync-batch",
        type=positive_int,
        default=0,
        help="keys per batch (default: the product's default sync_batch)",
    )


def _ledger_rate_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--rate",
        type=_rate,
        metavar="KEYS_PER_S",
        help="keys/s issued into the ledger stream (default 100000)",
    )


def _existing_rows_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--existing-rows",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="ledger rows of a registry's past loaded before measuring (default 0: empty)",
    )


def _pipeline_options(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--keysyncs", type=positive_int, default=1, help="keysync processes to run")
    bench.add_argument(
        "--redis-cluster",
        type=positive_int,
        default=0,
        metavar="SHARDS",
        help="run on a Redis Cluster of SHARDS primaries (a replica each) started on "
        "loopback for the run",
    )
    bench.add_argument(
        "--slot-per",
        choices=("namespace", "type"),
        default="namespace",
        help="with --redis-cluster: every key in one slot, or each type in a slot of its "
        "own on its own shard (redis_cluster.slot_per)",
    )
    bench.add_argument(
        "--types",
        type=positive_int,
        default=1,
        help="ID types served at once (each offered its share of --rate)",
    )
    bench.add_argument(
        "--rate",
        type=_rate,
        metavar="KEYS_PER_S",
        help="keys/s the clients offer together (default 200000; 0: full speed)",
    )


def non_negative_int(raw: str) -> int:
    """A whole number >= 0, digits or a power of ten as 1e8."""
    try:
        value = float(raw) if "e" in raw.lower() else int(raw)
    except ValueError:
        value = -1
    if value < 0 or value != int(value) or value > 10**10:
        raise argparse.ArgumentTypeError(
            f"must be a whole number >= 0 (e.g. 1000000 or 1e6), got {raw!r}"
        )
    return int(value)


def _spent_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--spent",
        type=_fraction,
        default=0.0,
        metavar="F",
        help="the fraction of each keyspace spent before measuring (default 0: fresh)",
    )


def _fraction(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1), got {raw!r}")
    return value


def _rows_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--rows", type=positive_int, default=1_000_000, help="IDs to import (default 10^6)"
    )


def _lifecycle_rate_option(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--rate",
        type=_rate,
        metavar="PUTS_PER_S",
        help="PUT /uin requests a second (half ASSIGNED, half UNASSIGNED), and ten lookups "
        "for each (default 50)",
    )


# Each benchmark's own options, beside --json and --seconds.
BENCH_OPTIONS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], ...]] = {
    "keygen": (_spent_option,),
    "dispense": (_load_option, _servers_option, _rounds_option),
    "snowflake": (_load_option,),
    "keysync": (_processes_option, _sync_batch_option),
    "ledger": (_processes_option, _ledger_rate_option, _existing_rows_option),
    "lifecycle": (_lifecycle_rate_option, _existing_rows_option),
    "pipeline": (_pipeline_options,),
    "import": (_rows_option,),
}


def _add_drill(drill: argparse.ArgumentParser) -> None:
    drill.add_argument("--rounds", type=positive_int, default=20, help="fault rounds")
    drill.add_argument("--faults", help="comma-separated fault kinds (default: all, in turn)")
    drill.add_argument("--json", metavar="PATH", help="also write the report to this file")
    drill.add_argument("--work-dir", help="keep servers' data and logs here")
    drill.add_argument(
        "--redis",
        choices=("sentinel", "cluster"),
        default="sentinel",
        help="the Redis topology: a primary with replicas and Sentinels (default), or a "
        "Redis Cluster of 3 primaries and 3 replicas with shard faults",
    )
    drill.add_argument(
        "--slot-per",
        choices=("namespace", "type"),
        default="namespace",
        help="with --redis cluster: every key in one slot (default), or each type in a "
        "slot of its own (redis_cluster.slot_per), two more types on the other shards "
        "checked never to pause",
    )
    drill.add_argument(
        "--postgres",
        choices=("pair", "patroni"),
        default="pair",
        help="the PostgreSQL stack: a primary and a replica the drill promotes itself "
        "(default), or three members under Patroni with etcd, failed over by Patroni "
        "(its faults: leader killed and rejoining rewound, switchover, failover, the "
        "leader cut off)",
    )
    drill.add_argument(
        "--synchronous-mode",
        action="store_true",
        help="with --postgres patroni: Patroni's synchronous_mode (strict): a promotion "
        "loses no commit, and the drill checks that the ledger's restore found nothing",
    )
    drill.add_argument(
        "--no-postgres-fence",
        action="store_true",
        help="switch the PostgreSQL fence off, to show the duplicates it prevents",
    )
    drill.add_argument(
        "--no-lease-wait",
        action="store_true",
        help="count machine-ID grants and renewals no replica acknowledged "
        "(lease_wait_replicas 0), to show the overlaps a partition then makes",
    )


def _add_up(up: argparse.ArgumentParser) -> None:
    up.add_argument("--data-dir", default=".keydispenser", help="where embedded servers keep data")
    up.add_argument("--port", type=int, help="dispenser HTTP port (default: dispenser.port, 8080)")
    up.add_argument("--postgres-dsn", help="use this PostgreSQL instead of an embedded one")
    up.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    up.add_argument(
        "--purge",
        action="store_true",
        help="remove the stopped stack's data (--data-dir, its embedded servers' data and "
        "its permutation key) and exit; keys it handed out are forgotten",
    )


def _rate(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of keys/s >= 0, got {raw!r}")
    return value


def whole_int(raw: str) -> int:
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {raw!r}")
    return int(raw)


def positive_int(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {raw!r}")
    return int(raw)


def write_json(report: dict[str, Any], path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2) + "\n")


def run_simulate(settings: Settings, args: argparse.Namespace) -> None:
    from keydispenser_ops.simulation.run import main

    code = main(args.first, args.seeds, args.workers, args.seed, args.json)
    if code:
        sys.exit(code)


def _add_simulate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seeds", type=positive_int, default=1000, help="how many seeds to run (default 1000)"
    )
    parser.add_argument("--first", type=whole_int, default=0, help="the first seed")
    parser.add_argument(
        "--seed", type=whole_int, default=None, help="run this one seed, its whole trace"
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        help="processes (default: CPUs)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the summary as JSON here")


# The commands, each an entry point of `keydispenser.commands` (pyproject.toml).
BOTH_STORES = frozenset({"postgres", "redis"})
FILL = Command(
    "pre-fill the cold inventory of one type",
    run_fill,
    _add_fill,
    stores=BOTH_STORES,
    needs_config=True,
)
# bench runs its own stores on the servers it is given, whatever the configured types.
BENCH = Command("measure throughput; writes JSON results", run_bench, _add_bench, BOTH_STORES)
DRILL = Command(
    "failover drill on loopback: Sentinel or Cluster, faults, load",
    run_drill,
    _add_drill,
    own_servers="--data-dir/--env-file: the drill runs its own servers",
)
SIMULATE = Command(
    "the ledger's real code under simulated faults, checked against its model, seed by seed",
    run_simulate,
    _add_simulate,
)
UP = Command(
    "the whole stack on this machine, embedded servers",
    run_up,
    _add_up,
    own_servers="--data-dir/--env-file before `up` name a running stack to use; `up` runs "
    "its own: keydispenser up --data-dir DIR",
)
