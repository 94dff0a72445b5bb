"""The drill's PostgreSQL stacks (``--postgres``), behind one small interface
(``PostgresStack``): ``pair``, a primary and an asynchronous streaming replica the
drill promotes itself (here), or ``patroni``, three members Patroni fails over
(drill/patroni.py). Each stack's faults are a module of its own (pair_faults.py,
patroni_faults.py).

The processes reach the servers through one multi-host DSN with
``target_session_attrs=read-write``, as operators run behind Patroni without a proxy:
whichever server is primary answers. After a failover of the pair the dead primary's
port is reused for a fresh replica of the new one, so the DSN never changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import asyncpg

from keydispenser_ops.embedded import EmbeddedPostgres, children_of, free_port

CATCH_UP_S = 30.0


class PostgresStack(Protocol):
    """What the drill asks of a PostgreSQL stack, whichever it is."""

    name: str  # --postgres
    # How long keysync keeps the ledger log (keysync.ledger_retain_s): above the longest
    # stretch of commits a promotion of this stack can lose, from the first lost commit
    # to the restore.
    ledger_retain_s: float

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def ports(self) -> list[int]:
        """Every server's port (each process reaches each through a proxy of its own)."""
        ...

    def dsn(self, database: str) -> str:
        """Every server, ``target_session_attrs=read-write`` (the drill's own reads)."""
        ...

    def admin_dsn(self, database: str) -> str:
        """The primary now, directly (to make the drill's database)."""
        ...

    def primary_pids(self) -> list[int]:
        """The primary's postmaster and every process of it (a pause stops them all)."""
        ...

    def describe(self) -> dict[str, Any]:
        """The stack as the report names it (what runs, which versions)."""
        ...


@dataclass
class PostgresPair:
    base: Path
    primary: EmbeddedPostgres | None = None
    replica: EmbeddedPostgres | None = None
    failovers: int = 0
    name: str = "pair"
    # The replica's 2 s lag, the drill's own promotion: shorter than the quiet spell after
    # each (faults.QUIET_AFTER_PROMOTION_S), so a restore that waited for traffic would
    # find its links trimmed.
    ledger_retain_s: float = 10.0

    def ports(self) -> list[int]:
        return [server.port for server in self.pair()]

    def admin_dsn(self, database: str) -> str:
        return self.pair()[0].dsn(database)

    def primary_pids(self) -> list[int]:
        return postgres_pids(self.pair()[0])

    def describe(self) -> dict[str, Any]:
        return {"postgres": self.name, "postgres_servers": 2, "failover_by": "the drill"}

    def start(self) -> None:
        self.primary = EmbeddedPostgres(self.base / "postgres-a", free_port())
        self.primary.start()
        self.replica = EmbeddedPostgres(self.base / "postgres-b", free_port())
        self.replica.start_replica_of(self.primary)

    def dsn(self, database: str) -> str:
        """Every server of the pair; connections go to whichever is the primary."""
        assert self.primary is not None and self.replica is not None
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sorted(self.pair(), key=_port))
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def pair(self) -> tuple[EmbeddedPostgres, EmbeddedPostgres]:
        assert self.primary is not None and self.replica is not None
        return self.primary, self.replica

    async def pause_replication(self) -> None:
        """The replica stops receiving WAL: commits from now on exist on the primary only."""
        replica = await asyncpg.connect(self.pair()[1].dsn())
        try:
            await replica.execute("ALTER SYSTEM SET primary_conninfo = ''")
            await replica.execute("SELECT pg_reload_conf()")
            await _until(replica, "SELECT count(*) = 0 FROM pg_stat_wal_receiver", 10)
        finally:
            await replica.close()

    async def promote_replica(self) -> None:
        """Promote the replica and leave the old primary up and writable: two primaries
        (a split brain), as when a failover manager promotes a replica it cannot reach
        the old primary to stop. ``primary`` names the promoted one from then on;
        ``heal`` rebuilds the old one as its replica."""
        old, new = self.pair()
        promoted = await asyncpg.connect(new.dsn())
        try:
            await promoted.execute("SELECT pg_promote(true, 60)")
        finally:
            await promoted.close()
        self.primary, self.replica = new, old
        self.failovers += 1

    async def heal(self) -> None:
        """After ``promote_replica``: the old primary, still running, is stopped and
        rebuilt as a replica of the promoted one (its divergent writes are gone)."""
        old = self.pair()[1]
        await asyncio.to_thread(old.kill)
        await asyncio.to_thread(old.start_replica_of, self.pair()[0])

    async def fail_over(self) -> None:
        """SIGKILL the primary, promote the replica, rebuild the dead one as its replica."""
        old, new = self.pair()
        await asyncio.to_thread(old.kill)
        promoted = await asyncpg.connect(new.dsn())
        try:
            await promoted.execute("SELECT pg_promote(true, 60)")
        finally:
            await promoted.close()
        self.primary, self.replica = new, old
        self.failovers += 1
        await asyncio.to_thread(old.start_replica_of, new)

    async def wait_for_replica(self) -> None:
        """The replica streams again (before the next fault)."""
        primary = await asyncpg.connect(self.pair()[0].dsn())
        try:
            query = "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'"
            await _until(primary, query, CATCH_UP_S)
        finally:
            await primary.close()

    def stop(self) -> None:
        for server in (self.primary, self.replica):
            if server is not None:
                server.stop("immediate")


def _port(server: EmbeddedPostgres) -> int:
    return server.port


async def _until(conn: asyncpg.Connection, query: str, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await conn.fetchval(query):
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"postgres: not true after {timeout_s}s: {query}")
        await asyncio.sleep(0.05)


@dataclass
class PostgresChain:
    """A primary and a chain of asynchronous streaming replicas on loopback, each
    replicating from the one before it (cascading): ``servers[0]`` is the primary,
    ``servers[1]`` its replica, ``servers[2]`` the replica of ``servers[1]``, ... A test
    stops each link on its own (``pause``) and promotes down the chain, so that each
    promoted server lacks commits of the one before it."""

    base: Path
    length: int = 3
    servers: list[EmbeddedPostgres] = field(default_factory=list)

    def start(self) -> None:
        for index in range(self.length):
            server = EmbeddedPostgres(self.base / f"postgres-{index}", free_port())
            if self.servers:
                server.start_replica_of(self.servers[-1])
            else:
                server.start()
            self.servers.append(server)

    def dsn(self, database: str) -> str:
        """Every server of the chain; connections go to whichever is a primary."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sorted(self.servers, key=_port))
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    async def pause(self, index: int) -> None:
        """``servers[index]`` stops receiving WAL from the server before it."""
        conn = await asyncpg.connect(self.servers[index].dsn())
        try:
            await conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            await conn.execute("SELECT pg_reload_conf()")
            await _until(conn, "SELECT count(*) = 0 FROM pg_stat_wal_receiver", 10)
        finally:
            await conn.close()

    async def caught_up(self, index: int) -> None:
        """Until ``servers[index]`` has replayed all its upstream server has written."""
        upstream = await asyncpg.connect(self.servers[index - 1].dsn())
        try:
            recovering = await upstream.fetchval("SELECT pg_is_in_recovery()")
            position = "pg_last_wal_replay_lsn()" if recovering else "pg_current_wal_lsn()"
            target = await upstream.fetchval(f"SELECT {position}::text")
        finally:
            await upstream.close()
        conn = await asyncpg.connect(self.servers[index].dsn())
        try:
            await _until(conn, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn", CATCH_UP_S)
        finally:
            await conn.close()

    async def promote(self, index: int) -> None:
        """SIGKILL every server before ``servers[index]`` that still runs, then promote it."""
        for server in self.servers[:index]:
            await asyncio.to_thread(server.kill)
        conn = await asyncpg.connect(self.servers[index].dsn())
        try:
            await conn.execute("SELECT pg_promote(true, 60)")
        finally:
            await conn.close()

    def stop(self) -> None:
        for server in self.servers:
            server.stop("immediate")


def postgres_pids(server: EmbeddedPostgres) -> list[int]:
    """The postmaster and every process of it (a whole server, as a VM pause stops it)."""
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
        postmaster = int((server.pgdata / "postmaster.pid").read_text().split()[0])
        return [postmaster, *children_of(postmaster)]
    return []
