"""``keydispenser up``: the whole stack on one machine, embedded servers by default."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import FrameType

from pydantic import SecretStr

from shared.domain.errors import KeydispenserError
from shared.domain.settings import Settings
from shared.ops.databases import run_migrate
from shared.ops.embedded import EmbeddedPostgres, EmbeddedRedis
from shared.ops.processes import cli_command, serving, spawn, stop_processes, types_not_serving

log = logging.getLogger(__name__)
CHILDREN = ("keygen", "keysync", "dispenser")
_RESTART_DELAY_S = 1.0
FIRST_KEYS_TIMEOUT_S = 300.0  # `up` announces itself only once every type has keys


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


def greeting(settings: Settings, base: str) -> str:
    """What ``up`` prints once the dispenser serves: where, and a request to try."""
    lines = [f"keydispenser is up: {base}  (Ctrl-C stops everything)"]
    first = next(iter(settings.id_types), None)
    if first is not None:  # a configuration may define no type at all
        lines.append(f"  try: curl -X POST {base}/v1/idgenerator/{first}/id")
    return "\n".join(lines)


def secrets_dir(data_dir: Path) -> Path:
    folder = data_dir / "secrets"
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)  # mkdir's mode is masked by the umask; an old folder is tightened
    return folder


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` holding ``text``, mode 0600, atomically: readers see no file or the
    whole secret, never a partial or group-readable one; the first writer wins."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".secret-")  # 0600
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
        os.close(fd)
        with contextlib.suppress(FileExistsError):  # another `up` created it first
            os.link(temporary, path)
    finally:
        os.unlink(temporary)


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
        dsn = self.args.postgres_dsn or os.environ.get("KD_POSTGRES_DSN")
        if not dsn:
            self.postgres = EmbeddedPostgres(self.data_dir / "postgres")
            self.postgres.start()
            dsn = self.postgres.dsn("keydispenser")
            log.info("embedded_postgres_started", extra={"port": self.postgres.port})
        url = self.args.redis_url or os.environ.get("KD_REDIS_URL")
        if not url:
            self.redis = EmbeddedRedis(self.data_dir / "redis")
            self.redis.start()
            url = self.redis.url
            log.info("embedded_redis_started", extra={"port": self.redis.port})
        return dsn, url

    def child_env(self, dsn: str, url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            KD_POSTGRES_DSN=dsn,
            KD_REDIS_URL=url,
            KD_PERMUTATION_KEY=permutation_key(self.settings, self.data_dir),
            KD_DISPENSER__PORT=str(self.args.port),
        )
        if self.args.config:
            env["KD_CONFIG"] = str(Path(self.args.config).resolve())
        return env

    def spawn(self, name: str, env: dict[str, str]) -> None:
        self.children[name] = spawn(cli_command(name), env)

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
        stop_processes(self.children.values())
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()


def up(settings: Settings, args: argparse.Namespace) -> None:

    stack = Stack(settings, args)
    prepare_data_dir(stack.data_dir)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stack.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        dsn, url = stack.start_servers()
        env = stack.child_env(dsn, url)
        key = SecretStr(env["KD_PERMUTATION_KEY"])
        asyncio.run(
            run_migrate(settings.model_copy(update={"postgres_dsn": dsn, "permutation_key": key}))
        )
        for name in CHILDREN:
            stack.spawn(name, env)
        base = f"http://{settings.dispenser.host}:{args.port}"
        if not serving(f"{base}/healthz", 30):
            raise KeydispenserError("dispenser did not start; see its log above")
        waiting = types_not_serving(f"{base}/readyz", 0)
        if waiting:
            print(f"keydispenser: generating the first keys of {', '.join(waiting)}...", flush=True)
            # Ctrl-C while waiting stops at once (the children got it too), not after
            # the timeout.
            waiting = types_not_serving(
                f"{base}/readyz", FIRST_KEYS_TIMEOUT_S, lambda: stack.stopping
            )
        if stack.stopping:
            return
        if waiting:
            raise KeydispenserError(
                f"no keys of {', '.join(waiting)} after {FIRST_KEYS_TIMEOUT_S:.0f} s; "
                "see the keygen and keysync logs above"
            )
        print(greeting(settings, base), flush=True)
        stack.supervise(env)
    finally:
        stack.shutdown()
