"""The ``keydispenser`` command line.

Each subcommand is wired to one handler with ``set_defaults(func=...)``. Handlers import
what they run inside their body: ``keydispenser dispenser`` loads no keygen's numpy code.
These are ordinary ``import`` statements, so the import contracts in ``pyproject.toml``
see them all. Other commands (the operator tooling's) come as plugins, found through
entry points (``plugins.py``): this module names none of them.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import logging
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import asyncpg
import yaml
from pydantic import ValidationError
from redis.exceptions import RedisError

from shared import logs
from shared.cli import moving, stack
from shared.cli.plugins import (
    MORE_COMMANDS,
    Command,
    Handler,
    Unavailable,
    declared,
    discover,
)
from shared.domain.apikeys import burst_advice, config_entry, new_api_key
from shared.domain.config import Settings, describe, load_settings
from shared.domain.config.loader import BUILTIN, config_file, default_config_path
from shared.domain.errors import ConfigError, KeydispenserError

log = logging.getLogger(__name__)


def run_keygen(settings: Settings, args: argparse.Namespace) -> None:
    from keygen.main import main

    main(settings)


def run_keysync(settings: Settings, args: argparse.Namespace) -> None:
    from keysync.main import main

    main(settings)


def run_dispenser(settings: Settings, args: argparse.Namespace) -> None:
    from dispenser.main import main

    main(settings)


def run_migrate(settings: Settings, args: argparse.Namespace) -> None:
    from shared.domain.idtypes import build_id_types
    from shared.domain.snowflake import build_snowflake_types
    from shared.stores.postgres.databases import run_migrate

    version = asyncio.run(run_migrate(settings))
    pooled = sorted(build_id_types(settings, generating=False))
    minted = sorted(build_snowflake_types(settings))
    line = f"schema at version {version}; id types: {', '.join(pooled)}"
    if minted:
        line += f"; snowflake types (no tables needed): {', '.join(minted)}"
    print(line)


def run_decode(settings: Settings, args: argparse.Namespace) -> None:
    from shared.domain.snowflake import build_snowflake_types

    types = build_snowflake_types(settings)
    if args.name not in types:
        known = ", ".join(sorted(types)) or "none configured"
        raise ConfigError(
            f"--type: '{args.name}' is not a snowflake type (snowflake types: {known})"
        )
    decoded = {"id": args.value, **types[args.name].decode(args.value).as_dict()}
    print(json.dumps(decoded, indent=2))


def run_status(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.status import collect_status, format_status

    report = asyncio.run(collect_status(settings))
    print(json.dumps(report, indent=2) if args.json else format_status(report))


def run_apikey(settings: Settings, args: argparse.Namespace) -> None:
    types = [t.strip() for t in args.types.split(",")] if args.types else None
    unknown = sorted(set(types or ()) - set(settings.id_types) - {"*"})
    if unknown:
        read = args.config or os.environ.get("KD_CONFIG") or "the built-in configuration"
        raise ConfigError(
            f"--types: {', '.join(unknown)} is not among the id_types of the configuration "
            f"read ({read}); "
            "pass the file that defines it: keydispenser --config FILE apikey ..."
        )
    key, key_digest = new_api_key()
    if args.burst is not None and args.rate is None:
        raise ConfigError("--burst: with --rate only (a key without a rate has no limit)")
    entry = config_entry(args.name, key_digest, types, args.rate, args.burst)
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
    if advice := burst_advice(args.rate, args.burst):
        print(advice, file=sys.stderr)


SECRET_ADVICE = """\
This is a permutation key: set it as KD_PERMUTATION_KEY (or permutation_key) for migrate,
keygen and fill. It defines the keyspace of every permuted type: keep it for as long as
the types live, the same in every environment that shares their keys, and back it up
where your other secrets live (a vault, a sealed secret): without it no new key of an
existing type can be made, and anyone who has it can guess keys. Never change it in
place (migrate refuses a changed one once keys exist)."""


def run_secret(settings: Settings, args: argparse.Namespace) -> None:
    from shared.runtime import write_secret

    key = secrets.token_urlsafe(48)
    if args.out:
        path = Path(args.out)
        if path.exists():
            raise ConfigError(f"--out: {path} exists; refusing to replace a permutation key")
        write_secret(path, key + "\n")
        print(f"permutation key written to {path} (mode 0600)\n")
    else:
        print(f"{key}\n")
    print(SECRET_ADVICE)


def run_fence_postgres(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.status import fence_postgres

    report = asyncio.run(fence_postgres(settings, args.skip_ranges, args.take_over))
    print(json.dumps(report, indent=2))


def run_ledger_resume(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.status import resume_ledger

    if not args.accept_loss:
        raise KeydispenserError(
            "ledger-resume gives up the ledger records a PostgreSQL promotion lost and the "
            "ledger log could not restore (`keydispenser status` names the halt): add "
            "--accept-loss to confirm"
        )
    print(json.dumps(asyncio.run(resume_ledger(settings, args.quarantine_file)), indent=2))


def run_retire(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.retire import refuse_configured, retire

    refuse_configured(settings, args.name)
    if not args.yes:
        raise KeydispenserError(
            f"retire '{args.name}' drops its cold table, sequence, hot list and fingerprint "
            "for good: add --yes to confirm"
        )
    report = asyncio.run(retire(settings, args.name, drop_ledger=args.drop_ledger))
    print(json.dumps(report, indent=2))
    if not report["found"]:
        raise KeydispenserError(f"no id type '{args.name}' in the database: nothing to retire")


def run_redis_acl(settings: Settings, args: argparse.Namespace) -> None:
    from shared.stores.redis.acl import acl_file, user_names

    passwords: dict[str, str] = {}
    if args.passwords:
        folder = Path(args.passwords)
        if not folder.is_dir():
            raise ConfigError(f"--passwords: {folder} is not a directory")
        for name in user_names(settings).values():
            given = folder / name
            if given.is_file():
                passwords[name] = given.read_text().strip()
    sys.stdout.write(acl_file(settings, passwords))


def run_lease(settings: Settings, args: argparse.Namespace) -> None:
    from shared.cli.lease import main

    sys.exit(main(settings, args))


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line. Plugins are loaded unless ``argv`` names one of the runtime's
    own commands: a process (``dispenser``, ``keygen``, ...) runs no other package's
    code, and starts without importing the tooling."""
    top = _CommandLine(
        prog="keydispenser", description=__doc__.split("\n")[0], epilog=f"More: {MORE_COMMANDS}."
    )
    top.add_argument("--config", help="YAML configuration file (default: $KD_CONFIG or built-in)")
    top.add_argument(
        "--data-dir",
        dest="stack_dir",
        help="use the stack `keydispenser up --data-dir DIR` runs (default: ./.keydispenser)",
    )
    top.add_argument("--env-file", help="use the settings of this stack file (stack.env)")
    commands = top.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=argparse.ArgumentParser
    )
    subcommand(commands, "migrate", run_migrate, "create or update the schema (idempotent)")
    subcommand(commands, "keygen", run_keygen, "run a keygen process")
    subcommand(commands, "keysync", run_keysync, "run a keysync process")
    subcommand(commands, "dispenser", run_dispenser, "run a dispenser process")
    _add_status(commands)
    _add_decode(commands)
    _add_apikey(commands)
    secret = subcommand(commands, "secret", run_secret, "generate a permutation key, with advice")
    secret.add_argument("--out", help="write it to this new file (mode 0600) instead")
    _add_fence_postgres(commands)
    resume = subcommand(
        commands,
        "ledger-resume",
        run_ledger_resume,
        "after a ledger halt: accept what the ledger log could not restore, resume",
    )
    resume.add_argument(
        "--accept-loss", action="store_true", help="confirm: the lost records stay lost"
    )
    resume.add_argument(
        "--quarantine-file",
        metavar="PATH",
        type=Path,
        help="where to list the keys quarantined, as id_type,key lines (default: "
        "ledger-quarantine-<UTC time>.csv in the working directory)",
    )
    _add_retire(commands)
    moving.add_import(commands)
    moving.add_export(commands)
    _add_lease(commands)
    acl = subcommand(
        commands,
        "redis-acl",
        run_redis_acl,
        "the Redis ACL file: a user per process, only its commands and its namespace's keys",
    )
    acl.add_argument(
        "--passwords",
        metavar="DIR",
        help="a file per user in DIR (named as the user, holding its password): each line "
        "gets its password's SHA-256 (without, no user can log in until given one)",
    )
    words = sys.argv[1:] if argv is None else argv
    plugin_names = {point.name for point in declared()}  # read, not loaded
    chosen = next((w for w in words if w in commands.choices or w in plugin_names), None)
    if chosen is None or chosen not in commands.choices:
        _add_plugins(commands, discover())
    return top


class _CommandLine(argparse.ArgumentParser):
    """The top parser: a command this installation lacks says where more come from."""

    def error(self, message: str) -> NoReturn:
        if "invalid choice" in message:
            message = f"{message}; {MORE_COMMANDS}"
        super().error(message)


def _add_plugins(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    plugins: Mapping[str, Command | Unavailable],
) -> None:
    """The commands plugins add (the operator tooling's in a checkout), each with its
    plugin in ``args.plugin``; a name the runtime's commands hold stays theirs."""
    for name, plugin in plugins.items():
        if name in commands.choices:
            continue
        command = subcommand(commands, name, plugin.run, plugin.help)
        command.set_defaults(plugin=plugin)
        plugin.add_arguments(command)


def subcommand(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    func: Handler,
    help_text: str,
) -> argparse.ArgumentParser:
    command = commands.add_parser(name, help=help_text)
    command.set_defaults(func=func)
    return command


def _add_status(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = subcommand(commands, "status", run_status, "inventory and keyspace headroom per type")
    status.add_argument("--json", action="store_true", help="machine-readable output")


def _add_decode(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    decode = subcommand(
        commands, "decode", run_decode, "time, machine and sequence of a snowflake ID"
    )
    decode.add_argument(
        "--type", required=True, dest="name", metavar="ID_TYPE", help="ID type name"
    )
    decode.add_argument("value", help="the ID, as the dispenser gave it")


def _add_apikey(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    apikey = subcommand(
        commands, "apikey", run_apikey, "create an API key; prints its config entry"
    )
    apikey.add_argument("--name", required=True, help="client name (letters, digits, _ . -)")
    apikey.add_argument("--types", help="comma-separated ID types it may use (default: all)")
    apikey.add_argument("--rate", type=float, help="keys per second (default: unlimited)")
    apikey.add_argument(
        "--burst",
        type=int,
        help="keys it may take at once, the largest count a request may ask for "
        "(default: a second of --rate)",
    )


def _add_fence_postgres(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fence = subcommand(
        commands,
        "fence-postgres",
        run_fence_postgres,
        "after a halt: discard cold inventory, move sequences on, resume (docs/reliability.md)",
    )
    fence.add_argument(
        "--skip-ranges",
        required=True,
        type=_whole,
        help="extra ranges every sequence skips past the highest lease on record",
    )
    fence.add_argument(
        "--take-over",
        action="store_true",
        help="fence even when the record follows a newer timeline or another database: "
        "this database is the one from now on (a restore, a move to a new cluster)",
    )


def _add_retire(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    retire = subcommand(
        commands,
        "retire",
        run_retire,
        "drop a type removed from the configuration: tables, sequence, Redis state",
    )
    retire.add_argument("--type", required=True, dest="name", metavar="ID_TYPE", help="its name")
    retire.add_argument("--yes", action="store_true", help="confirm: this cannot be undone")
    retire.add_argument(
        "--drop-ledger", action="store_true", help="drop its ledger table too (kept by default)"
    )


def _add_lease(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lease = commands.add_parser(
        "lease",
        help="run a command holding a machine ID; `lease list --pool P` shows holders",
        usage="keydispenser lease --pool NAME --min A --max B [--wait S] [--ttl S] -- COMMAND ..."
        "\n       keydispenser lease list --pool NAME [--json]",
        description="Runs COMMAND with KD_MACHINE_ID set to a machine ID of [A, B] in pool "
        "NAME, leased in Redis and renewed while it runs (docs/leases.md). COMMAND gets "
        "SIGTERM the moment the lease is lost; the exit status is COMMAND's, or 75 when no "
        "ID is free within --wait.",
    )
    lease.set_defaults(func=run_lease, lease_parser=lease)
    lease.add_argument("--pool", help="pool name (the namespace, e.g. the environment)")
    lease.add_argument("--min", type=_whole, help="lowest machine ID of the range")
    lease.add_argument("--max", type=_whole, help="highest machine ID of the range")
    lease.add_argument("--wait", type=_seconds, default=0.0, help="wait this long for a free ID")
    lease.add_argument("--ttl", type=_seconds, default=10.0, help="lease TTL (default 10)")
    lease.add_argument(
        "--renew-every", type=_seconds, default=1.0, help="renewal interval (default 1)"
    )
    lease.add_argument(
        "--kill-after",
        type=_seconds,
        help="SIGKILL COMMAND this long after the SIGTERM of a lost lease "
        "(default: the lease's safety margin, ttl/10 up to 1 s)",
    )
    lease.add_argument("--metrics-port", type=int, help="serve /metrics on this port meanwhile")
    lease.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    lease.add_argument("lease_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


# The stores each command reaches (and so must have been named: stack.py).
COMMAND_STORES: dict[str, frozenset[str]] = {
    "migrate": frozenset({"postgres"}),
    "keygen": frozenset({"postgres", "redis"}),
    "keysync": frozenset({"postgres", "redis"}),
    "dispenser": frozenset({"redis"}),
    "status": frozenset({"postgres", "redis"}),
    "fence-postgres": frozenset({"postgres", "redis"}),
    "ledger-resume": frozenset({"postgres", "redis"}),
    "retire": frozenset({"postgres", "redis"}),
    "lease": frozenset({"redis"}),
}
# Commands that act on the stores with the configuration's types: none runs on the
# built-in configuration unless told to (KD_CONFIG=builtin); a lease names its pool
# itself. (A plugin's Command says both for its command.)
NEEDS_CONFIG = frozenset(COMMAND_STORES) - {"lease"}


def builtin_types() -> list[str]:
    body = yaml.safe_load(default_config_path().read_text()) or {}
    return sorted(body.get("id_types") or {})


# The long-running processes (and `lease -- COMMAND`: long_running). `up` starts them with
# its stack's settings in their environment; started otherwise (a unit, a container)
# they never pick up a stack file found in the working directory, which would point a
# production process at a dev stack's servers: only one named with --env-file or
# --data-dir.
PROCESSES = frozenset({"dispenser", "keygen", "keysync"})


def long_running(args: argparse.Namespace) -> bool:
    """A process, or `lease -- COMMAND`, which wraps one (and hands the environment on
    to it); `lease list` is a look, like `status`."""
    if args.command == "lease":
        wrapped = list(getattr(args, "lease_command", []) or [])
        return not (wrapped and wrapped[0] == "list")
    return args.command in PROCESSES


# KD_ variables that are not settings: the configuration file, test hooks, what
# `keydispenser lease` gives its command, bench internals.
OTHER_VARIABLES = frozenset(
    {
        "KD_CONFIG",
        "KD_FAULT_POINT",
        "KD_FAULT_ARMED",
        "KD_EMBEDDED_RUNTIME",
        "KD_MACHINE_ID",
        "KD_MACHINE_ID_POOL",
        "KD_MACHINE_ID_FLOOR_MS",
        "KD_BENCH_BASELINE_DSN",
        "KD_WORKER_METRICS_DIR",
    }
)


def main(argv: Sequence[str] | None = None) -> None:
    command_line = parser(argv)
    args, unknown = command_line.parse_known_args(argv)
    if isinstance(getattr(args, "plugin", None), Unavailable):  # whatever options followed
        args.plugin.run(None, args)
    if unknown:
        command_line.error(f"unrecognized arguments: {' '.join(unknown)}")
    settings: Settings | None = None
    try:
        settings = _settings(args)
        logs.configure(args.command, settings.log_level, settings.log_levels, settings.log_format)
        warn_unneeded_secrets(args.command, settings)
        args.func(settings, args)
        sys.stdout.flush()  # a reader that closed the pipe is seen here, not at exit
    except BrokenPipeError:
        # `keydispenser status | head`: the reader had enough. No fault of any store.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)  # as if SIGPIPE had ended it, which is what the shell expects
    except ConfigError as exc:
        print(f"keydispenser: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeydispenserError as exc:
        print(f"keydispenser {args.command}: {exc} (exit 1)", file=sys.stderr)
        sys.exit(1)
    except OPERATOR_ERRORS as exc:
        # Unreachable servers, missing databases, malformed DSNs: one line, no traceback.
        print(f"keydispenser {args.command}: {failure(exc, settings)} (exit 1)", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


# Processes that never generate a key, and so must not hold the permutation key.
WITHOUT_THE_KEY = frozenset({"dispenser", "keysync"})


def warn_unneeded_secrets(command: str, settings: Settings) -> None:
    """A warning when a process holds the permutation key it never uses: with it, anyone
    who reads that process's environment can compute every future ID. A warning, not a
    refusal: an upgrade by restart does not take a serving dispenser down over it."""
    if command in WITHOUT_THE_KEY and settings.permutation_key is not None:
        log.warning(
            "secret_not_needed",
            extra={
                "setting": "permutation_key",
                "advice": f"{command} never generates keys: remove KD_PERMUTATION_KEY "
                "from its environment (only keygen, fill and migrate need it)",
            },
        )


DRIVER_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    RedisError,
)


# What a command can meet from outside: unreachable servers, missing databases, bad DSNs.
OPERATOR_ERRORS: tuple[type[Exception], ...] = (*DRIVER_ERRORS, OSError, ValueError, OverflowError)


def _settings(args: argparse.Namespace) -> Settings:
    """The settings a command runs with: its stack's (``up``'s, unless it is ``up``)
    under the environment, the configuration file, and a refusal when a store it
    reaches was named by nobody."""
    stale = None
    named_stack = bool(args.env_file or args.stack_dir)
    plugin: Command | None = getattr(args, "plugin", None)
    own_servers = plugin.own_servers if plugin else ""
    if named_stack and own_servers:
        raise ConfigError(own_servers)
    if not own_servers and (not long_running(args) or named_stack):
        found = stack.find(args.env_file, args.stack_dir)
        if found is not None and found.running:
            stack.apply(found, os.environ)
        stale = found
    if args.config and args.config != BUILTIN and not Path(args.config).is_file():
        raise ConfigError(f"--config: configuration file not found: {args.config}")
    _warn_unknown_variables(os.environ)
    settings = load_settings(args.config)
    named = stack.named_stores(args.config, os.environ)
    needs = plugin.stores if plugin else COMMAND_STORES.get(args.command, frozenset())
    beside_up = not long_running(args)
    stack.require_named(f"keydispenser {args.command}", set(needs), named, stale, beside_up)
    needs_config = plugin.needs_config if plugin else args.command in NEEDS_CONFIG
    if needs_config and config_file(args.config) is None:
        raise ConfigError(
            f"KD_CONFIG: no configuration file: `keydispenser {args.command}` would run on "
            f"the built-in ID types ({', '.join(builtin_types())}) against whatever database "
            "it reaches; name yours (KD_CONFIG=/etc/keydispenser/keydispenser.yaml, or "
            f"--config FILE), or KD_CONFIG={BUILTIN} to use the built-in types on purpose"
        )
    if args.config:  # worker processes (dispenser.workers > 1) read the same file
        os.environ["KD_CONFIG"] = (
            BUILTIN if args.config == BUILTIN else str(Path(args.config).resolve())
        )
    return settings


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """One line per KD_ variable that maps to no setting (a typo is otherwise silent)."""
    known = {f"KD_{name.upper()}" for name in Settings.model_fields}
    for name in sorted(environ):
        if not name.startswith("KD_") or name in OTHER_VARIABLES or name.startswith("KD_TEST_"):
            continue
        top = name.split("__", 1)[0]
        if top in known:
            continue
        near = difflib.get_close_matches(top, sorted(known), n=1)
        hint = f" (did you mean {near[0] + name[len(top) :]}?)" if near else ""
        print(f"keydispenser: warning: {name} matches no setting{hint}", file=sys.stderr)


def where(url: str) -> str:
    """A DSN or URL without its scheme, credentials and options: host:port/database."""
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2] + parts.path


def failure(exc: BaseException, settings: Settings | None) -> str:
    """What failed and where, for an error a driver raised (credentials never shown)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if settings is None:
        return text
    postgres = f"postgres {where(settings.postgres_dsn)}"
    if settings.redis_sentinel:
        redis = f"redis sentinels {','.join(settings.redis_sentinel.sentinels)}"
    elif settings.redis_cluster:
        redis = f"redis cluster nodes {','.join(settings.redis_cluster.nodes)}"
    else:
        redis = f"redis {where(settings.redis_url)}"
    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
        return f"{postgres}: {text}"
    if isinstance(exc, RedisError):
        return f"{redis}: {text}"
    return f"{postgres} or {redis}: {text}"


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {raw!r}")
    return value


def _whole(raw: str) -> int:
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {raw!r}")
    return int(raw)
