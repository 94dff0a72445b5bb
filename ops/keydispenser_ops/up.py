"""``keydispenser up``: the whole stack on one machine, embedded servers by default."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pydantic import SecretStr

from keydispenser_ops.embedded import EmbeddedPostgres, EmbeddedRedis, runtime_root
from keydispenser_ops.processes import (
    cli_command,
    serving,
    spawn,
    stop_processes,
    types_not_serving,
)
from shared.cli.plugins import stack
from shared.domain.config import Settings
from shared.domain.config.loader import BUILTIN
from shared.domain.errors import ConfigError, KeydispenserError
from shared.runtime import pid_alive, write_secret
from shared.stores.postgres.databases import run_migrate
from shared.stores.postgres.sql import SELECT_RANGE_STATS

log = logging.getLogger(__name__)
CHILDREN = ("keygen", "keysync", "dispenser")
_RESTART_DELAY_S = 1.0
FIRST_KEYS_TIMEOUT_S = 300.0  # `up` announces itself only once every type has keys
# Loggers `up` quiets in its children unless log levels are configured: keygen's line per
# range filled (a sparse type fills a hundred before its first keys are out).
QUIET_LOGGERS = {"keygen.ranges": "WARNING"}
PROGRESS_EVERY_S = 5.0  # meanwhile, how often it says how far each type has got


def permutation_key(settings: Settings, data_dir: Path) -> str:
    """The configured secret, else one created once and kept in the data directory's
    ``secrets`` directory (0700; the file 0600 from its first byte)."""
    if settings.permutation_key is not None:
        return settings.permutation_key.get_secret_value()
    legacy = data_dir / "permutation.key"  # where earlier versions kept it
    if legacy.exists():
        legacy.chmod(0o600)
        return legacy.read_text().strip()
    path = secrets_dir(data_dir) / "permutation.key"
    if not path.exists():
        write_secret(path, secrets.token_urlsafe(48))
    return path.read_text().strip()


def greeting(settings: Settings, base: str, dsn: str = "", url: str = "", env: str = "") -> str:
    """What ``up`` prints once the dispenser serves: where everything is, and the next
    commands to try (plain text, whatever the log format)."""
    lines = [f"keydispenser is up: {base}  (Ctrl-C stops everything)"]
    for label, value in (("PostgreSQL", dsn), ("Redis", url), ("settings", env)):
        if value:
            lines.append(f"  {label:<11} {value}")
    if env:
        lines.append("  (every keydispenser command run in this directory uses these settings)")
    lines.append("Try:")
    pooled = [n for n, c in settings.id_types.items() if c.kind != "snowflake"]
    minted = [n for n, c in settings.id_types.items() if c.kind == "snowflake"]
    if pooled:  # a configuration may define no type at all
        lines.append(f"  curl -X POST {base}/v1/idgenerator/{pooled[0]}/id")
        lines.append(f"  curl -X POST '{base}/v1/keys/{pooled[-1]}?count=5'")
    command = invocation()
    if minted:
        lines.append(f"  curl -X POST {base}/v1/idgenerator/{minted[0]}/id")
        lines.append(f"  {command} decode --type {minted[0]} <an {minted[0]} ID>")
    lines.append(f"  {command} status")
    lines.append(f"  curl {base}/openapi.json  (the API), curl {base}/metrics")
    return "\n".join(lines)


def invocation() -> str:
    """How the user ran keydispenser (``.venv/bin/keydispenser`` after ``make up``),
    so that the commands ``up`` suggests work as printed."""
    ran = Path(sys.argv[0])
    if ran.name != "keydispenser":
        return "keydispenser"
    found = shutil.which("keydispenser")
    if found and Path(found).resolve() == ran.resolve():
        return "keydispenser"
    with contextlib.suppress(ValueError):
        return str(ran.resolve().relative_to(Path.cwd()))
    return str(ran)


def port_taken(host: str, port: int) -> str | None:
    """Why ``up`` cannot serve on ``host:port`` (None when it can): checked before
    anything starts, so a taken port costs a second, not a started stack."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"port {port} on {host} is not free ({exc.strerror or exc}): " + (
                "stop what uses it, or pass --port N"
            )
    return None


def _minted(settings: Settings, name: str) -> bool:
    """A snowflake type: minted on a leased machine ID, never generated into tiers."""
    config = settings.id_types.get(name)
    return config is not None and config.kind == "snowflake"


def first_keys_note(settings: Settings, waiting: list[str]) -> str:
    """What ``up`` waits for: keys of pooled types, a machine-ID lease for snowflake ones."""
    keys = [n for n in waiting if not _minted(settings, n)]
    leases = [n for n in waiting if _minted(settings, n)]
    parts = []
    if keys:
        parts.append(f"generating the first keys of {', '.join(keys)}")
    if leases:
        ttl = max(getattr(settings.id_types[n], "lease_ttl_s", 0.0) for n in leases)
        parts.append(
            f"leasing a machine ID for {', '.join(leases)} (a Redis server grants none for "
            f"one lease TTL after its first use, {ttl:g} s)"
        )
    return "keydispenser: " + "; ".join(parts) + "..."


def secrets_dir(data_dir: Path) -> Path:
    folder = data_dir / "secrets"
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)  # mkdir's mode is masked by the umask; an old folder is tightened
    return folder


def prepare_data_dir(data_dir: Path) -> None:
    """The data directory, closed to other users (traversable only when root, for the
    unprivileged user embedded PostgreSQL runs as)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o711 if os.geteuid() == 0 else 0o700)


class Stack:
    def __init__(self, settings: Settings, args: argparse.Namespace) -> None:
        self.settings = settings
        self.args = args
        self.data_dir = Path(args.data_dir).resolve()
        self.postgres: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False

    def start_servers(self) -> tuple[str, str]:
        """PostgreSQL's DSN and Redis's URL ("" when Redis is a Sentinel-monitored
        primary or a Redis Cluster the user named: no embedded Redis then)."""
        found_by = redis_found_by(self.settings)
        if found_by and self.args.redis_url:
            raise ConfigError(
                f"--redis-url: the settings find Redis through {found_by}, which takes "
                "the place of a URL; give one or the other"
            )
        dsn = self.args.postgres_dsn or os.environ.get("KD_POSTGRES_DSN")
        if not dsn:
            self.postgres = EmbeddedPostgres(self.data_dir / "postgres")
            self.postgres.start()
            dsn = self.postgres.dsn("keydispenser")
            log.info("embedded_postgres_started", extra={"port": self.postgres.port})
        url = self.args.redis_url or os.environ.get("KD_REDIS_URL")
        if found_by:
            return dsn, ""
        if not url:
            self.redis = EmbeddedRedis(self.data_dir / "redis")
            self.redis.start()
            url = self.redis.url
            log.info("embedded_redis_started", extra={"port": self.redis.port})
        return dsn, url

    def stack_settings(self, dsn: str, url: str) -> dict[str, str]:
        """What the stack's processes, and every command run beside it, are given."""
        found = {
            "KD_POSTGRES_DSN": dsn,
            **({"KD_REDIS_URL": url} if url else {}),
            # Named in the environment: the stack file carries it to every command run
            # beside the stack (named in a configuration file: KD_CONFIG, below).
            **_redis_named_in_environment(),
            "KD_PERMUTATION_KEY": permutation_key(self.settings, self.data_dir),
            "KD_DISPENSER__HOST": self.settings.dispenser.host,
            "KD_DISPENSER__PORT": str(self.args.port),
        }
        # The configuration up runs on; its built-in one on purpose when none is named
        # (a process never falls back to it by itself: KD_CONFIG).
        named = self.args.config or os.environ.get("KD_CONFIG") or BUILTIN
        found["KD_CONFIG"] = named if named == BUILTIN else str(Path(named).resolve())
        return found

    def child_env(self, dsn: str, url: str) -> dict[str, str]:
        env = dict(os.environ) | self.stack_settings(dsn, url)
        if "KD_LOG_FORMAT" not in os.environ:  # as up's own: console on a terminal
            env["KD_LOG_FORMAT"] = self.settings.log_format
        if "KD_LOG_LEVELS" not in os.environ and not self.settings.log_levels:
            env["KD_LOG_LEVELS"] = json.dumps(QUIET_LOGGERS)  # up says how far keygen got
        return env

    def spawn(self, name: str, env: dict[str, str]) -> None:
        if name not in KEY_HOLDERS:  # each process only the secrets it needs
            env = {k: v for k, v in env.items() if k != "KD_PERMUTATION_KEY"}
        # Ended with up, however up ends (SIGKILL, a closed terminal).
        self.children[name] = spawn(cli_command(name), env, die_with_parent=True)

    def supervise(self, env: dict[str, str]) -> None:
        """Restart a child that dies until asked to stop."""
        while not self.stopping:
            for name, child in list(self.children.items()):
                if child.poll() is not None and not self.stopping:
                    log.error("child_exited", extra={"child": name, "code": child.returncode})
                    time.sleep(_RESTART_DELAY_S)
                    self.spawn(name, env)
            time.sleep(0.2)

    def shutdown(self) -> None:
        self.stopping = True
        stack.remove(self.data_dir, (stack.STACK_FILE,))  # commands beside it: gone now
        stop_processes(self.children.values())
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()
        stack.remove(self.data_dir, (stack.PID_FILE,))  # last: --purge waits for it


# The children that generate keys, and so are given the permutation key.
KEY_HOLDERS = frozenset({"keygen"})


# What a stack's data directory holds (`up` writes nothing else there), and what proves
# a directory is one.
STACK_ENTRIES = frozenset(
    {"postgres", "redis", "secrets", "permutation.key", stack.STACK_FILE, stack.PID_FILE}
)
STACK_PROOF = (
    "secrets/permutation.key",
    "permutation.key",
    "postgres/PGDATA_LOCATION",
    "postgres/pgdata/PG_VERSION",
)


def purge(data_dir: Path) -> list[Path]:
    """Remove a stopped stack's data: the entries of its data directory `up` wrote, the
    directory itself, and the PostgreSQL data kept outside it (under the embedded
    servers' runtime directory, where ``PGDATA_LOCATION`` says). Refuses while its ``up``
    or its PostgreSQL runs, and a directory that is not a stack's. Returns what went."""
    if not data_dir.is_dir():
        return []
    strangers = sorted(p.name for p in data_dir.iterdir() if p.name not in STACK_ENTRIES)
    if strangers or not any((data_dir / proof).exists() for proof in STACK_PROOF):
        held = (
            f"holds {', '.join(strangers)}, which `keydispenser up` does not write"
            if (strangers)
            else "holds no stack's data"
        )
        raise ConfigError(f"--data-dir: {data_dir} {held}: not a stack's, nothing removed")
    pid_file = data_dir / stack.PID_FILE
    if pid_file.exists() and stack.up_running(pid_file):
        raise ConfigError(f"--purge: the stack in {data_dir} is running; stop it (Ctrl-C) first")
    postgres = EmbeddedPostgres(data_dir / "postgres")
    outside = _pgdata_outside(data_dir, postgres.pgdata)
    if (postgres.pgdata / "postmaster.pid").exists():
        postgres.stop()  # left running by an `up` that was killed
        if (postgres.pgdata / "postmaster.pid").exists():
            raise ConfigError(f"--purge: PostgreSQL in {postgres.pgdata} did not stop")
    removed = []
    if outside is not None:
        shutil.rmtree(outside)
        removed.append(outside)
    for name in sorted(STACK_ENTRIES):
        entry = data_dir / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
    data_dir.rmdir()
    return [*removed, data_dir]


def clean_leftovers(data_dir: Path) -> list[str]:
    """What an ``up`` that ended without stopping (SIGKILL, a crash, a closed terminal
    with its servers' reapers gone too) left in ``data_dir``, each cleaned: its pid and
    stack files, its PostgreSQL and Redis still running. One line each."""
    pid_file = data_dir / stack.PID_FILE
    if not pid_file.exists():
        return []
    found = [f"found {pid_file} of an `up` that did not stop ({pid_file.read_text().strip()})"]
    postgres = EmbeddedPostgres(data_dir / "postgres")
    postmaster = postgres.postmaster()
    if postmaster is not None and pid_alive(postmaster):
        postgres.stop()
        found.append(f"found its PostgreSQL still running (pid {postmaster}): stopped")
    redis = EmbeddedRedis.left_running(data_dir / "redis")
    if redis is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(redis, signal.SIGTERM)
        found.append(f"found its Redis still running (pid {redis}): stopped")
    stack.remove(data_dir)
    found.append(f"removed its {stack.STACK_FILE} and {stack.PID_FILE}")
    return found


def _pgdata_outside(data_dir: Path, pgdata: Path) -> Path | None:
    """The stack's PostgreSQL data when kept outside its data directory: only the path
    this data directory maps to, under the runtime directory, and only when the
    directory's ``PGDATA_LOCATION`` names that very path (a copied data directory names
    its original's: that is never removed)."""
    if pgdata.is_relative_to(data_dir) or not pgdata.is_dir():
        return None
    location = data_dir / "postgres" / "PGDATA_LOCATION"
    recorded = location.read_text().strip() if location.is_file() else ""
    if not pgdata.resolve().is_relative_to(runtime_root().resolve()) or recorded != str(pgdata):
        raise ConfigError(
            f"--purge: {location} names {recorded or 'nothing'}, not {pgdata}: a copied "
            "or moved data directory; remove its PostgreSQL data by hand"
        )
    return pgdata


def dispenser_port(settings: Settings, given: int | None) -> int:
    """The port `up` serves on: ``--port`` when given, else the configuration's
    (``dispenser.port``, which ``KD_DISPENSER__PORT`` overrides: the environment wins)."""
    return given if given is not None else settings.dispenser.port


def up(settings: Settings, args: argparse.Namespace) -> None:
    if args.purge:
        removed = purge(Path(args.data_dir).resolve())
        for path in removed:
            print(f"removed {path}")
        if not removed:
            print(f"nothing to remove: no {args.data_dir}")
        return
    args.port = dispenser_port(settings, args.port)
    taken = port_taken(settings.dispenser.host, args.port)
    if taken is not None:
        raise KeydispenserError(taken)
    stack_obj = Stack(settings, args)
    prepare_data_dir(stack_obj.data_dir)
    pid_file = stack_obj.data_dir / stack.PID_FILE
    if pid_file.exists() and stack.up_running(pid_file):
        raise KeydispenserError(f"a stack already runs from {stack_obj.data_dir} ({pid_file})")
    for line in clean_leftovers(stack_obj.data_dir):
        print(f"keydispenser up: {line}", flush=True)
    stack.claim(stack_obj.data_dir)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stack_obj.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        dsn, url = stack_obj.start_servers()
        env = stack_obj.child_env(dsn, url)
        key = SecretStr(env["KD_PERMUTATION_KEY"])
        asyncio.run(
            run_migrate(settings.model_copy(update={"postgres_dsn": dsn, "permutation_key": key}))
        )
        written = stack.write(stack_obj.data_dir, stack_obj.stack_settings(dsn, url))
        for name in CHILDREN:
            stack_obj.spawn(name, env)
        base = f"http://{settings.dispenser.host}:{args.port}"
        if not serving(f"{base}/healthz", 30, lambda: stack_obj.stopping):
            if stack_obj.stopping:
                return
            raise KeydispenserError("dispenser did not start; see its log above")
        waiting = types_not_serving(f"{base}/readyz", 0)
        if waiting:
            print(first_keys_note(settings, waiting), flush=True)
            waiting = _wait_for_first_keys(settings, f"{base}/readyz", dsn, stack_obj)
        if stack_obj.stopping:
            return
        if waiting:
            raise KeydispenserError(
                f"no keys of {', '.join(waiting)} after {FIRST_KEYS_TIMEOUT_S:.0f} s; "
                "see the keygen and keysync logs above"
            )
        redis = _shown(url) if url else f"{redis_found_by(settings)} (as configured)"
        print(greeting(settings, base, _shown(dsn), redis, _relative(written)), flush=True)
        stack_obj.supervise(env)
    finally:
        stack_obj.shutdown()


def _wait_for_first_keys(settings: Settings, readyz: str, dsn: str, stack_obj: Stack) -> list[str]:
    """Wait until every type serves; meanwhile, every ``PROGRESS_EVERY_S``, one line per
    pooled type still waiting: keys made so far and how fast. Ctrl-C stops at once (the
    children got it too), not after the timeout. Returns the types still waiting."""
    deadline = time.monotonic() + FIRST_KEYS_TIMEOUT_S
    made: dict[str, tuple[float, int]] = {}
    while True:
        left = deadline - time.monotonic()
        waiting = types_not_serving(
            readyz, min(PROGRESS_EVERY_S, max(left, 0)), lambda: stack_obj.stopping
        )
        if not waiting or stack_obj.stopping or time.monotonic() >= deadline:
            return waiting
        pooled = [n for n in waiting if n in settings.id_types and not _minted(settings, n)]
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            for name, keys in asyncio.run(_keys_made(dsn, pooled)).items():
                print(progress_line(name, keys, made.get(name), time.monotonic()), flush=True)
                made[name] = (time.monotonic(), keys)


def progress_line(name: str, keys: int, before: tuple[float, int] | None, now: float) -> str:
    """``farmer: 120,000 keys made (40,000/s)``; the rate since the line before."""
    if before is None or now <= before[0]:
        return f"  {name}: {keys:,} keys made"
    rate = (keys - before[1]) / (now - before[0])
    return f"  {name}: {keys:,} keys made ({rate:,.0f}/s)"


async def _keys_made(dsn: str, names: list[str]) -> dict[str, int]:
    """Keys keygen has made of each type (its ranges' accepted counts)."""
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        rows = {name: await conn.fetchrow(SELECT_RANGE_STATS, name) for name in names}
        return {name: int(row["accepted"]) for name, row in rows.items() if row is not None}
    finally:
        await conn.close()


_REDIS_FOUND_BY = ("KD_REDIS_SENTINEL", "KD_REDIS_CLUSTER")


def _redis_named_in_environment() -> dict[str, str]:
    """KD_REDIS_SENTINEL / KD_REDIS_CLUSTER and their nested variables (``__PASSWORD``),
    each on one line (the stack file has a line per variable): JSON compacted."""
    found = {}
    for name, value in os.environ.items():
        if any(name == n or name.startswith(n + "__") for n in _REDIS_FOUND_BY):
            if name in _REDIS_FOUND_BY:  # a JSON object (a nested value is taken as is)
                with contextlib.suppress(ValueError):
                    value = json.dumps(json.loads(value), separators=(",", ":"))
            found[name] = value
    return found


def redis_found_by(settings: Settings) -> str:
    """How the settings find Redis other than by a URL ("" for a URL)."""
    if settings.redis_sentinel:
        return f"Sentinel ({','.join(settings.redis_sentinel.sentinels)})"
    if settings.redis_cluster:
        return f"Redis Cluster ({','.join(settings.redis_cluster.nodes)})"
    return ""


def _shown(url: str) -> str:
    """A DSN or URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _relative(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)
