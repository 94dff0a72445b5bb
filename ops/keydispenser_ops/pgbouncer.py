"""PgBouncer on loopback in front of a PostgreSQL server, as registries run it (each
operator for PostgreSQL ships it as its pooler): for tests and drills.

It serves every database of the server (``* =``), lets every role in without a password
(``auth_type = trust``; roles it does not list are looked up through ``auth_user``), and
lends server connections per ``pool_mode``: ``transaction`` (what operators run) or
``session``. PgBouncer refuses to run as root: as root it runs as ``nobody``, like the
embedded PostgreSQL. The binary is Debian's (``apt-get install pgbouncer``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from keydispenser_ops import reaper
from keydispenser_ops.embedded import (
    UNPRIVILEGED_USER,
    EmbeddedServerError,
    free_port,
    reachable_by,
    runtime_root,
)
from keydispenser_ops.processes import listening, stop_process

PoolMode = Literal["session", "transaction"]
START_DEADLINE_S = 10.0


def pgbouncer_binary() -> str | None:
    """PgBouncer's program (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def pgbouncer_version() -> str:
    """``PgBouncer 1.18.0`` as the binary says (empty when there is none)."""
    binary = pgbouncer_binary()
    if binary is None:
        return ""
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0].strip() if done.stdout else ""


def _as_user() -> str | None:
    """PgBouncer refuses to run as root: as root, it runs as the unprivileged user."""
    return UNPRIVILEGED_USER if os.geteuid() == 0 else None


def through(dsn: str, port: int, host: str = "127.0.0.1") -> str:
    """``dsn`` with its host and port replaced by ``host:port`` (the pooler's), user,
    password, database and options kept."""
    parts = urlsplit(dsn)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class EmbeddedPgBouncer:
    """One PgBouncer in ``data_dir`` on a loopback port, pooling for the server at
    ``server_host:server_port`` (``admin_user``: a superuser there, trusted)."""

    data_dir: Path
    server_host: str
    server_port: int
    pool_mode: PoolMode = "transaction"
    admin_user: str = "postgres"
    port: int = 0
    pool_size: int = 20
    # Startup parameters it lets through unread instead of refusing the connection.
    ignore_startup_parameters: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    _reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @functools.cached_property
    def home(self) -> Path:
        """Where its files live: ``data_dir``, or when the unprivileged user cannot
        reach it (a private temporary directory), a directory of the runtime root."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if reachable_by(_as_user(), self.data_dir):
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:16]
        return runtime_root() / f"pgbouncer-{digest}"

    @property
    def config(self) -> Path:
        return self.home / "pgbouncer.ini"

    @property
    def log(self) -> Path:
        return self.home / "pgbouncer.log"

    def dsn(self, server_dsn: str) -> str:
        """``server_dsn`` (a DSN of the server behind) through this pooler."""
        return through(server_dsn, self.port)

    def start(self) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise EmbeddedServerError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.port = self.port or free_port()
        self._write_config()
        with (self.home / "pgbouncer.out").open("ab") as out:
            self.process = subprocess.Popen(
                [binary, str(self.config)],
                user=_as_user(),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._reaper = reaper.watch(self.process.pid)
        if not listening(self.port, START_DEADLINE_S, self.process):
            logs = (self.log, self.home / "pgbouncer.out")
            output = "".join(each.read_text() for each in logs if each.exists())
            self.stop()
            raise EmbeddedServerError(f"pgbouncer did not listen on {self.port}: {output[-2000:]}")

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o755)
        users = self.home / "users.txt"
        users.write_text(f'"{self.admin_user}" ""\n')
        self.config.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"auth_user = {self.admin_user}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            f"ignore_startup_parameters = {','.join(self.ignore_startup_parameters)}\n"
            f"logfile = {self.log}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        for each in (users, self.config):
            each.chmod(0o644)
        user = _as_user()
        if user is not None:  # its log is written as the unprivileged user
            record = pwd.getpwnam(user)
            self.log.touch()
            os.chown(self.log, record.pw_uid, record.pw_gid)

    def stop(self) -> None:
        stop_process(self.process)
        if self._reaper is not None:
            self._reaper.wait(15)
        if self.home != self.data_dir:  # its own directory of the runtime root
            shutil.rmtree(self.home, ignore_errors=True)
