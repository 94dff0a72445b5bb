"""A Redis primary, replicas and Sentinels on loopback ports, for failover drills."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from keydispenser_ops import reaper
from keydispenser_ops.embedded import free_port, redis_server_command, valkey_server_binary
from keydispenser_ops.processes import kill_process, spawn, stop_processes

MASTER = "kd"


@dataclass(frozen=True)
class ServerAuth:
    """Redis servers with ACL users (``acl_file``, keydispenser redis-acl): Sentinel and
    the replicas log in as their own users, and the topology itself as ``admin``."""

    acl_file: Path
    sentinel: tuple[str, str]  # user, password
    replica: tuple[str, str]
    admin: tuple[str, str]


@dataclass
class RedisServer:
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    announce_port: int = 0  # the port it announces (its proxy's): 0 for its own
    reaper: subprocess.Popen[bytes] | None = None  # ends it if the drill ends first
    login: tuple[str, str] | None = None  # user and password this side logs in as

    @property
    def public_port(self) -> int:
        """The port the Sentinels, replicas and Sentinel's answers use."""
        return self.announce_port or self.port

    @property
    def dump(self) -> Path:
        return self.data_dir / f"dump-{self.port}.rdb"

    def client(self) -> redis.Redis:
        user, password = self.login or (None, None)
        return redis.Redis(
            port=self.port,
            socket_timeout=2,
            socket_connect_timeout=1,
            decode_responses=True,
            username=user,
            password=password,
        )

    def command(self, *args: Any) -> Any:
        """A raw command (redis-py leaves execute_command untyped)."""
        return self.client().execute_command(*args)  # type: ignore[no-untyped-call]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Topology:
    base: Path
    down_after_ms: int = 1000
    servers: list[RedisServer] = field(default_factory=list)
    sentinels: list[RedisServer] = field(default_factory=list)
    # Maps a server's port to the port it announces (a proxy in front of it), so that
    # the Sentinels and replicas reach it only through that proxy (links.py).
    announce: Callable[[int], int] | None = None
    auth: ServerAuth | None = None  # ACL users on the servers (none: the default user)

    def start(self, replicas: int = 2, sentinels: int = 3) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        ports = [free_port() for _ in range(1 + replicas)]
        login = self.auth.admin if self.auth else None
        for port in ports:
            announced = self.announce(port) if self.announce else 0
            home = self.base / f"redis-{port}"
            self.servers.append(RedisServer(port, home, None, announced, login=login))
        first = self.servers[0]
        for server in self.servers:
            self._launch(server, replica_of=None if server is first else first.public_port)
        for _ in range(sentinels):
            sentinel = RedisServer(free_port(), self.base / "sentinels")
            self.sentinels.append(sentinel)
            self._launch_sentinel(sentinel, first.public_port)
        self.wait_for_primary(timeout_s=20)

    def sentinel_addresses(self) -> list[str]:
        return [f"127.0.0.1:{s.port}" for s in self.sentinels]

    def _launch(self, server: RedisServer, replica_of: int | None) -> None:
        server.data_dir.mkdir(parents=True, exist_ok=True)
        # SAVE writes to ``dump``, which the old-snapshot fault copies and restores.
        # Full syncs start at once rather than after the default 5 s delay.
        options = ["--dbfilename", server.dump.name, "--repl-diskless-sync-delay", "0"]
        if server.announce_port:
            options += ["--replica-announce-ip", "127.0.0.1"]
            options += ["--replica-announce-port", str(server.announce_port)]
        if replica_of is not None:
            options += ["--replicaof", "127.0.0.1", str(replica_of)]
        if self.auth is not None:  # every server may become a replica: each logs in so
            options += ["--aclfile", str(self.auth.acl_file)]
            options += ["--masteruser", self.auth.replica[0], "--masterauth", self.auth.replica[1]]
        server.process = spawn(
            redis_server_command(server.port, server.data_dir, *options), output="discard"
        )
        server.reaper = reaper.watch(server.process.pid)  # gone with the drill, however it ends
        self._wait_port(server)

    def _launch_sentinel(self, sentinel: RedisServer, primary_port: int) -> None:
        sentinel.data_dir.mkdir(parents=True, exist_ok=True)
        conf = sentinel.data_dir / f"sentinel-{sentinel.port}.conf"
        conf.write_text(
            f"port {sentinel.port}\nbind 127.0.0.1\ndir {sentinel.data_dir}\n"
            f"logfile {sentinel.data_dir / f'sentinel-{sentinel.port}.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} 4000\n"
            f"sentinel parallel-syncs {MASTER} 2\n" + self._sentinel_login()
        )
        sentinel.process = spawn(
            [valkey_server_binary(), str(conf), "--sentinel"], output="discard"
        )
        sentinel.reaper = reaper.watch(sentinel.process.pid)
        self._wait_port(sentinel)

    def _sentinel_login(self) -> str:
        if self.auth is None:
            return ""
        user, password = self.auth.sentinel
        return f"sentinel auth-user {MASTER} {user}\nsentinel auth-pass {MASTER} {password}\n"

    @staticmethod
    def _wait_port(server: RedisServer, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if server.client().ping():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis on port {server.port} did not start")

    # --- who is who -----------------------------------------------------------

    def primary_port(self) -> int | None:
        """The primary as the Sentinels' majority sees it."""
        votes: dict[int, int] = {}
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                host_port = sentinel.command("SENTINEL", "get-master-addr-by-name", MASTER)
                if host_port:
                    port = int(host_port[1])
                    votes[port] = votes.get(port, 0) + 1
        best = max(votes.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] >= 2 else None

    def identity(self) -> tuple[int, str] | None:
        """The primary's port and identity (``run_id:master_replid``, what the fence
        records as its owner), or None while there is no agreed primary."""
        try:
            primary = self.primary()
            server, replication = (
                primary.client().info("server"),
                primary.client().info("replication"),
            )
        except (redis.RedisError, RuntimeError):
            return None
        return primary.port, f"{server['run_id']}:{replication['master_replid']}"

    def server(self, port: int) -> RedisServer:
        """The server on ``port``, or announcing it."""
        return next(s for s in self.servers if port in (s.port, s.announce_port))

    def primary(self) -> RedisServer:
        port = self.primary_port()
        if port is None:
            raise RuntimeError("sentinels agree on no primary")
        return self.server(port)

    def role(self, server: RedisServer) -> str:
        try:
            return str(server.command("ROLE")[0])
        except redis.RedisError:
            return "down"

    def wait_for_primary(self, timeout_s: float, not_port: int | None = None) -> int:
        """Until the Sentinels agree on a primary (other than ``not_port``) that says so."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.primary_port()
            server = self.server(port) if port is not None else None
            if server is not None and server.port != not_port and self.role(server) == "master":
                return server.port
            time.sleep(0.05)
        raise RuntimeError("no primary elected in time")

    def wait_for_replicas(self, count: int, timeout_s: float = 20) -> None:
        """Until the primary has ``count`` replicas online and in sync."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, RuntimeError):
                info = self.primary().client().info("replication")
                online = [
                    v
                    for k, v in info.items()
                    if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
                ]
                if len(online) >= count:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"primary did not get {count} replicas in time")

    # --- faults ---------------------------------------------------------------

    def kill(self, server: RedisServer) -> None:
        kill_process(server.process)

    def restart(self, server: RedisServer, snapshot: Path | None = None) -> None:
        """Start a killed server again (from ``snapshot`` if given); Sentinel re-adopts it."""
        self.kill(server)
        if snapshot is not None:
            shutil.copy(snapshot, server.dump)
        self._launch(server, replica_of=None)

    def snapshot(self, server: RedisServer, keep: Path) -> None:
        server.client().save()
        shutil.copy(server.dump, keep)

    def sentinel_failover(self) -> None:
        self.sentinels[0].command("SENTINEL", "FAILOVER", MASTER)

    def stop(self) -> None:
        stop_processes([each.process for each in [*self.sentinels, *self.servers]], 5)
