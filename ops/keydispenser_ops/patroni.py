"""A Patroni cluster on loopback, as registries run PostgreSQL: etcd (Debian's
``etcd-server``) and three PostgreSQL members, each run by a Patroni of its own (PyPI's
``patroni[etcd3]``), failing over by Patroni's own rules; for the drill
(``keydispenser drill --postgres patroni``) and the tests.

Patroni and PostgreSQL run as ``nobody`` when we are root (PostgreSQL refuses root).
That user must reach an interpreter and Patroni's packages: when this interpreter is
private (a pyenv under /root), Patroni's distributions are staged once into the runtime
directory (``embedded.runtime_root``) and run by the system's Python of the same
version. PostgreSQL is the system's (``embedded.system_postgres_bin``: pg_rewind, TLS).

Every address another party uses can be routed through a proxy of the caller's
(``announce``: the port a member's PostgreSQL is reached on by the other members;
``dcs_route``: the etcd address a member talks to), so a member can be cut off from the
rest (drill/links.py). Patroni's REST API (never proxied) tells who leads.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from keydispenser_ops import reaper
from keydispenser_ops.embedded import (
    UNPRIVILEGED_USER,
    EmbeddedServerError,
    children_of,
    free_port,
    reachable_by,
    runtime_root,
    system_postgres_bin,
)
from keydispenser_ops.processes import kill_process, listening, stop_processes

SCOPE = "kd"
# Patroni's leader key lives TTL_S (20 s, Patroni's least): a leader that stops renewing
# it (killed, cut off) is replaced once it expired. Each member looks every LOOP_WAIT_S;
# a DCS that does not answer for RETRY_TIMEOUT_S makes a leader step down.
TTL_S = 20
LOOP_WAIT_S = 1
RETRY_TIMEOUT_S = 5
# A replica this far behind may still be promoted (async mode: the fences and the ledger
# restore make up for what it lacks; Patroni's default, 1 MB, would leave the cluster
# without a leader after a lagging kill).
MAXIMUM_LAG_ON_FAILOVER = 1 << 30
START_DEADLINE_S = 120.0
EXTRAS = ("etcd3", "psycopg2-binary")  # patroni's extras the cluster needs


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def patroni_version() -> str | None:
    """The installed Patroni's version (None: not installed)."""
    try:
        return importlib.metadata.version("patroni")
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_tools() -> list[str]:
    """What a Patroni cluster needs that is not here (empty: it can run)."""
    missing = []
    if etcd_binary() is None:
        missing.append("etcd (apt-get install etcd-server)")
    if patroni_version() is None:
        missing.append("patroni (pip install 'patroni[etcd3]' psycopg2-binary)")
    if system_postgres_bin() is None:
        missing.append("PostgreSQL with pg_rewind (apt-get install postgresql)")
    return missing


def _as_user() -> str | None:
    return UNPRIVILEGED_USER if os.geteuid() == 0 else None


@dataclass
class Etcd:
    """One etcd member on loopback: Patroni's DCS."""

    data_dir: Path
    client_port: int = 0
    peer_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    _reaper: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        binary = etcd_binary()
        if binary is None:
            raise EmbeddedServerError("etcd is not installed (apt-get install etcd-server)")
        self.client_port = self.client_port or free_port()
        self.peer_port = self.peer_port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://{self.address}", f"http://127.0.0.1:{self.peer_port}"
        argv = [
            binary,
            "--name", "kd",
            "--data-dir", str(self.data_dir / "etcd"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kd={peer}",
            "--log-level", "warn",
        ]  # fmt: skip
        with (self.data_dir / "etcd.log").open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self._reaper = reaper.watch(self.process.pid)
        if not listening(self.client_port, 30, self.process):
            raise EmbeddedServerError(f"etcd did not listen on {self.client_port}")
        self._wait_for_cluster_version(30)

    def _wait_for_cluster_version(self, timeout_s: float) -> None:
        """Until etcd decided its cluster's version (a moment after it listens): Patroni,
        started before, stops on the "not_decided" it reads."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if self._versions().get("etcdcluster", "not_decided") != "not_decided":
                    return
            time.sleep(0.1)
        raise EmbeddedServerError(f"etcd decided no cluster version within {timeout_s:g}s")

    def _versions(self) -> dict[str, str]:
        with urllib.request.urlopen(f"http://{self.address}/version", timeout=2) as reply:
            found: dict[str, str] = json.loads(reply.read())
            return found

    def version(self) -> str:
        return str(self._versions().get("etcdserver", ""))

    def stop(self) -> None:
        stop_processes([self.process])
        if self._reaper is not None:
            self._reaper.wait(15)


@dataclass
class Member:
    """One PostgreSQL server and the Patroni that runs it."""

    name: str
    home: Path  # its configuration, log and data, reachable by the user it runs as
    pg_port: int
    rest_port: int
    announce_pg: int  # where the other members reach its PostgreSQL
    dcs: str  # the etcd address it talks to
    announce_rest: int = 0  # where the other members reach its REST API (0: rest_port)
    process: subprocess.Popen[bytes] | None = None
    reaper: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.home / "patroni.yml"

    @property
    def log(self) -> Path:
        return self.home / "patroni.log"

    @property
    def data_dir(self) -> Path:
        return self.home / "pgdata"

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def dsn(self, database: str = "postgres") -> str:
        """Its own PostgreSQL, directly (to inspect it)."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{database}"

    def postgres_pids(self) -> list[int]:
        """Its postmaster and every process of it (none when it is not running)."""
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError, PermissionError):
            postmaster = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            return [postmaster, *children_of(postmaster)]
        return []

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def rewound(self, since: int = 0) -> bool:
        """Whether Patroni ran pg_rewind on it (its log says so, from byte ``since``)."""
        if not self.log.exists():
            return False
        with self.log.open("rb") as log:
            log.seek(since)
            return b"pg_rewind" in log.read()


@dataclass
class PatroniCluster:
    base: Path
    size: int = 3
    synchronous_mode: bool = False
    # A member's port (its PostgreSQL's, its REST API's) -> the port the other members
    # reach it on
    announce: Callable[[int], int] | None = None
    # (member name, etcd's port) -> the port the member reaches etcd on
    dcs_route: Callable[[str, int], int] | None = None
    members: list[Member] = field(default_factory=list)
    etcd: Etcd | None = None
    _command: tuple[list[str], dict[str, str]] = field(default_factory=lambda: ([], {}))

    # --- starting and stopping -------------------------------------------------------

    def start(self, timeout_s: float = START_DEADLINE_S) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.etcd = Etcd(self.base / "etcd")
        self.etcd.start()
        self._command = patroni_command(_as_user())
        home = _reachable_home(self.base)
        for number in range(self.size):
            port = free_port()
            name = f"pg{number}"
            announced = self.announce(port) if self.announce else port
            etcd_port = self.etcd.client_port
            dcs = f"127.0.0.1:{self.dcs_route(name, etcd_port) if self.dcs_route else etcd_port}"
            rest = free_port()
            rest_announced = self.announce(rest) if self.announce else rest
            member = Member(name, home / name, port, rest, announced, dcs, rest_announced)
            self.members.append(member)
        for member in self.members:  # the first bootstraps, the others clone it
            self._write_config(member)
            self.spawn(member)
            if member is self.members[0]:
                self.wait_for_leader(timeout_s)
        self.wait_for_replicas(self.size - 1, timeout_s)

    def _write_config(self, member: Member) -> None:
        member.home.mkdir(parents=True, exist_ok=True)
        member.home.chmod(0o755)
        member.config.write_text(yaml.safe_dump(self._config(member)))
        member.config.chmod(0o644)
        user = _as_user()
        if user is not None:
            shutil.chown(member.home, user)
            shutil.chown(member.config, user)

    def _config(self, member: Member) -> dict[str, Any]:
        binaries = system_postgres_bin()
        if binaries is None:
            raise EmbeddedServerError("no PostgreSQL with pg_rewind (apt-get install postgresql)")
        host, _, port = member.dcs.rpartition(":")
        return {
            "scope": SCOPE,
            "name": member.name,
            "log": {"dir": str(member.home), "file_num": 1, "level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{member.rest_port}",
                "connect_address": f"127.0.0.1:{member.announce_rest or member.rest_port}",
            },
            # The address given is the only way to etcd (a proxy of the caller's, which
            # may be cut): no discovery of the addresses etcd advertises.
            "etcd3": {"hosts": [f"{host}:{port}"], "protocol": "http", "use_proxies": True},
            "bootstrap": {
                "dcs": self._dcs(),
                "initdb": [{"encoding": "UTF8"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.announce_pg}",
                "data_dir": str(member.data_dir),
                "bin_dir": str(binaries),
                "pgpass": str(member.home / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(member.home)},
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
        }

    def _dcs(self) -> dict[str, Any]:
        return {
            "ttl": TTL_S,
            "loop_wait": LOOP_WAIT_S,
            "retry_timeout": RETRY_TIMEOUT_S,
            "maximum_lag_on_failover": MAXIMUM_LAG_ON_FAILOVER,
            # Synchronous, strictly: no commit is acknowledged before a standby has it,
            # even with every standby away (commits wait), and only that standby may be
            # promoted. Without strict, Patroni drops to asynchronous replication when
            # the standby goes, and a promotion may lose what was committed meanwhile.
            "synchronous_mode": self.synchronous_mode,
            "synchronous_mode_strict": self.synchronous_mode,
            "postgresql": {
                "use_pg_rewind": True,
                "use_slots": True,
                "parameters": {
                    "wal_level": "replica",
                    "hot_standby": "on",
                    "wal_log_hints": "on",
                    "max_wal_senders": 10,
                    "max_replication_slots": 10,
                    "wal_keep_size": "256MB",
                    "fsync": "on",
                },
            },
        }

    def spawn(self, member: Member) -> None:
        """Start (or start again) the member's Patroni: a member that was the leader
        and fell behind the new one's timeline rejoins, rewound (pg_rewind)."""
        argv, env = self._command
        with (member.home / "patroni.out").open("ab") as out:  # its log is its own
            member.process = subprocess.Popen(
                [*argv, str(member.config)],
                env=env,
                user=_as_user(),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        member.reaper = reaper.watch(member.process.pid)

    def kill(self, member: Member) -> None:
        """SIGKILL the member's Patroni and its PostgreSQL, as a machine that dies."""
        pids = member.postgres_pids()
        kill_process(member.process)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _done(member.reaper)

    def stop(self) -> None:
        for member in self.members:
            stop_processes([member.process], 30)
            for pid in member.postgres_pids():  # a postmaster its Patroni left
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _done(member.reaper)
        if self.etcd is not None:
            self.etcd.stop()
        homes = {member.home.parent for member in self.members}
        for home in homes - {self.base}:  # a directory of the runtime root, its own
            shutil.rmtree(home, ignore_errors=True)

    # --- who is who ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The cluster as a member's REST API says (``/cluster``; the first to answer)."""
        for member in self.members:
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"{member.rest}/cluster", timeout=2) as reply,
            ):
                found: dict[str, Any] = json.loads(reply.read())
                return found
        return {}

    def leader(self) -> Member | None:
        for row in self.state().get("members", []):
            if row.get("role") == "leader" and row.get("state") == "running":
                return self.member(row["name"])
        return None

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def replicas(self) -> list[Member]:
        leader = self.leader()
        return [m for m in self.members if leader is None or m.name != leader.name]

    def wait_for_leader(self, timeout_s: float, not_name: str | None = None) -> Member:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None and found.name != not_name and _writable(found):
                return found
            time.sleep(0.2)
        raise RuntimeError(f"patroni: no leader (other than {not_name}) within {timeout_s:g}s")

    def wait_for_member(self, member: Member, timeout_s: float) -> bool:
        """Until ``member`` streams from the leader (or leads); False at the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for row in self.state().get("members", []):
                following = row.get("state") == "streaming" or row.get("role") == "leader"
                if row.get("name") == member.name and following:
                    return True
            time.sleep(0.2)
        return False

    def wait_for_replicas(self, count: int, timeout_s: float) -> None:
        """Until ``count`` members stream from the leader (and, in synchronous mode,
        one of them is the synchronous standby)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rows = self.state().get("members", [])
            streaming = [r for r in rows if r.get("state") == "streaming"]
            synced = any(r.get("role") == "sync_standby" for r in rows)
            if len(streaming) >= count and (synced or not self.synchronous_mode):
                return
            time.sleep(0.2)
        raise RuntimeError(f"patroni: {count} replicas not streaming within {timeout_s:g}s")

    def dsn(self, database: str, ports: list[int] | None = None) -> str:
        """Every member (or ``ports``), ``target_session_attrs=read-write``: whichever
        leads answers, as docs/operations.md tells operators to write it."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in (ports or [m.pg_port for m in self.members]))
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def patronictl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """patronictl, as an operator runs it, with the first member's configuration."""
        return subprocess.run(
            [*_ctl_command(), "-c", str(self.members[0].config), *args],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    def candidate(self) -> Member:
        """A replica Patroni would hand over to: the synchronous standby in synchronous
        mode (the only one it promotes), else any streaming replica."""
        wanted = "sync_standby" if self.synchronous_mode else "replica"
        for row in self.state().get("members", []):
            if row.get("role") == wanted and row.get("state") == "streaming":
                return self.member(row["name"])
        raise RuntimeError(f"patroni: no streaming {wanted} to hand over to")

    def switchover(self, candidate: Member) -> None:
        leader = self.leader()
        assert leader is not None
        self._ctl("switchover", "--leader", leader.name, "--candidate", candidate.name, "--force")

    def failover(self, candidate: Member) -> None:
        self._ctl("failover", "--candidate", candidate.name, "--force")

    def _ctl(self, *args: str) -> None:
        done = self.patronictl(*args)
        if done.returncode != 0 or "successfully" not in done.stdout.lower():
            raise RuntimeError(
                f"patronictl {args[0]} failed: {done.stdout[-500:]}{done.stderr[-500:]}"
            )


def _writable(member: Member) -> bool:
    """Whether the member's PostgreSQL takes writes (Patroni names a leader a moment
    before its promotion ends)."""
    with (
        contextlib.suppress(OSError, ValueError),
        urllib.request.urlopen(f"{member.rest}/primary", timeout=2) as reply,
    ):
        return bool(reply.status == 200)
    return False


def _done(watching: subprocess.Popen[bytes] | None) -> None:
    if watching is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            watching.wait(5)


def _reachable_home(base: Path) -> Path:
    """Where the members' files go: ``base``, or a directory of the runtime root when the
    user they run as cannot reach it."""
    if reachable_by(_as_user(), base):
        return base
    made = Path(tempfile.mkdtemp(prefix="patroni-", dir=_runtime_dir()))
    made.chmod(0o755)
    return made


def _runtime_dir() -> Path:
    root = runtime_root()
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    return root


# --- running Patroni as the unprivileged user --------------------------------------


def patroni_command(user: str | None) -> tuple[list[str], dict[str, str]]:
    """How ``user`` runs Patroni (its command and environment): this interpreter when
    it can, else the system's Python of this version over a staged copy of Patroni's
    distributions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KD_")}
    if reachable_by(user, Path(sys.executable).resolve()):
        return [sys.executable, "-m", "patroni"], env
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists():
        raise EmbeddedServerError(
            f"patroni: {sys.executable} is not reachable by {user}, and there is no {system}"
        )
    return [str(system), "-m", "patroni"], env | {"PYTHONPATH": _staged()}


def _ctl_command() -> list[str]:
    """patronictl, run by this process (as root it needs no other user)."""
    found = Path(sys.executable).parent / "patronictl"
    return [str(found)] if found.exists() else [sys.executable, "-m", "patroni.ctl"]


def _staged() -> str:
    """Patroni's distributions (and what they need, with its etcd3 and psycopg2
    extras), copied once where the unprivileged user reaches them."""
    version = patroni_version()
    target = (
        _runtime_dir() / f"patroni-{version}-py{sys.version_info.major}{sys.version_info.minor}"
    )
    if (target / ".complete").exists():
        return str(target)
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=_runtime_dir()))
    for dist in _closure("patroni", EXTRAS):
        for file in dist.files or ():
            source = Path(str(dist.locate_file(file)))
            if not source.is_file() or ".." in file.parts:
                continue
            copied = staging / file
            copied.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copied)
    (staging / ".complete").touch()
    for path in [staging, *staging.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        staging.rename(target)
    except OSError:  # another process staged it first
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _closure(root: str, extras: tuple[str, ...]) -> Iterator[importlib.metadata.Distribution]:
    """``root`` and every installed distribution it requires (with ``extras``)."""
    seen: set[str] = set()
    todo = [root, *extras]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        yield dist
        for requirement in dist.requires or ():
            spec, _, marker = requirement.partition(";")
            if "extra" in marker and not any(f'"{e}"' in marker for e in extras):
                continue
            found = _NAME.match(spec.strip())
            if found:
                todo.append(found.group(0))
