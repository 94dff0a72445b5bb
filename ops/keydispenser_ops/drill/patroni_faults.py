"""The faults of PostgreSQL under Patroni (``--postgres patroni``), each made through
Patroni as operators meet them: the leader killed (after its replicas missed its last
commits, in asynchronous mode) and rejoining rewound, a ``patronictl switchover`` and
``failover``, the leader cut off from its cluster and from every process.

In asynchronous mode (``synchronous_mode: false``) a killed leader's last commits are
lost with it: the PostgreSQL fence discards, the ledger's restore writes its lost links
again. In synchronous mode (``--synchronous-mode``: synchronous and strict) a commit is
acknowledged only once the synchronous standby holds it, and only that standby is
promoted: nothing is lost, and the report checks that the restore found nothing to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from keydispenser_ops.drill.faults import LAG_WINDOW_S, Drill, Fault, Outcome
from keydispenser_ops.drill.links import PROCESSES
from keydispenser_ops.drill.patroni import PatroniStack
from keydispenser_ops.patroni import TTL_S, Member
from shared.stores.fence import sql as fence_sql

# How long a promotion may take once the leader is gone: its leader key expires (TTL_S),
# then a replica wins the race.
PROMOTION_DEADLINE_S = TTL_S + 40.0
REJOIN_DEADLINE_S = 90.0  # a member started again follows the new leader (rewound)
# A leader cut off stays so until another was promoted, and this long after: two
# servers that each believed they lead, for a while.
CUT_AFTER_PROMOTION_S = 3.0


@dataclass
class PatroniFaults:
    drill: Drill
    stack: PatroniStack

    def faults(self) -> dict[str, Fault]:
        return {
            "patroni_leader_kill": self.leader_kill,
            "patroni_switchover": self.switchover,
            "patroni_failover": self.failover,
            "patroni_cut_leader": self.cut_leader,
        }

    async def leader_kill(self) -> Outcome:
        """In asynchronous mode the replicas first stop receiving the leader's WAL for
        LAG_WINDOW_S under load (their links to it dropped); then the leader dies: its
        Patroni and PostgreSQL SIGKILLed, as a machine that dies. Patroni promotes a
        replica once the leader key expired; the dead member starts again and rejoins,
        rewound (pg_rewind) when it had commits the new leader lacks.

        In synchronous mode the kill comes under load with the standbys connected: a
        synchronous standby cannot fall behind the commits, and one cut off is no
        longer synchronous, which leaves Patroni none to promote after the leader dies
        (by design: it waits for an operator rather than lose a commit)."""
        drill, cluster = self.drill, self.stack.cluster
        fenced_before = await drill.postgres_discarded()
        old = await asyncio.to_thread(cluster.wait_for_leader, 30)
        since = old.log_size()
        dispensed = drill.load.dispensed
        lag_s = 0.0 if self.stack.synchronous_mode else LAG_WINDOW_S
        if lag_s:
            # The replicas' link to it drops (nothing held to be delivered later, as a
            # cut would: their WAL stops where it is), and every reconnection fails.
            drill.links.cut_infra(old.pg_port, "reset")
        await asyncio.sleep(lag_s or LAG_WINDOW_S)
        in_lag = drill.load.dispensed - dispensed if lag_s else 0
        killed = time.monotonic()
        await asyncio.to_thread(cluster.kill, old)
        drill.links.heal()
        new = await asyncio.to_thread(cluster.wait_for_leader, PROMOTION_DEADLINE_S, old.name)
        promoted_ms = round((time.monotonic() - killed) * 1000)
        rejoin = await self._rejoin(old, since, started_again=True)
        quiet = await drill.quiet_ledger()
        return Outcome(
            {
                "old_leader": old.name,
                "new_leader": new.name,
                "lag_window_s": lag_s,
                "keys_in_lag_window": in_lag,
                "promoted_ms": promoted_ms,
                **rejoin,
                "quiet_s": quiet,
            },
            postgres_discarded_before=fenced_before,
        )

    async def switchover(self) -> Outcome:
        """``patronictl switchover``: the leader hands over to a replica it waits for."""
        return await self._handover("switchover")

    async def failover(self) -> Outcome:
        """``patronictl failover --candidate``: a named replica is promoted."""
        return await self._handover("failover")

    async def _handover(self, how: str) -> Outcome:
        drill, cluster = self.drill, self.stack.cluster
        fenced_before = await drill.postgres_discarded()
        old = await asyncio.to_thread(cluster.wait_for_leader, 30)
        candidate = await asyncio.to_thread(cluster.candidate)
        since = old.log_size()
        began = time.monotonic()
        act = cluster.switchover if how == "switchover" else cluster.failover
        await asyncio.to_thread(act, candidate)
        new = await asyncio.to_thread(cluster.wait_for_leader, PROMOTION_DEADLINE_S, old.name)
        promoted_ms = round((time.monotonic() - began) * 1000)
        rejoin = await self._rejoin(old, since, started_again=False)
        quiet = await drill.quiet_ledger()
        return Outcome(
            {
                "old_leader": old.name,
                "new_leader": new.name,
                "promoted_ms": promoted_ms,
                **rejoin,
                "quiet_s": quiet,
            },
            postgres_discarded_before=fenced_before,
        )

    async def cut_leader(self) -> Outcome:
        """The leader cut off from etcd, from its replicas and from every process (its
        server and its Patroni stay up): Patroni steps it down once etcd stopped
        answering, and promotes a replica once its leader key expired. Then the links
        heal and it follows the new leader (rewound if it must be)."""
        drill, cluster = self.drill, self.stack.cluster
        fenced_before = await drill.postgres_discarded()
        old = await asyncio.to_thread(cluster.wait_for_leader, 30)
        since = old.log_size()
        began = time.monotonic()
        drill.links.cut_dcs(old.name)
        drill.links.cut_infra(old.pg_port)  # its replicas
        drill.links.cut_infra(old.rest_port)  # the other members asking its REST API
        for name in PROCESSES:
            drill.links.cut_postgres(name, old.pg_port)
        try:
            new = await asyncio.to_thread(cluster.wait_for_leader, PROMOTION_DEADLINE_S, old.name)
            promoted_ms = round((time.monotonic() - began) * 1000)
            await asyncio.sleep(CUT_AFTER_PROMOTION_S)
            writable = await _writable(old)
        finally:
            drill.links.heal()
        rejoin = await self._rejoin(old, since, started_again=False)
        quiet = await drill.quiet_ledger()
        return Outcome(
            {
                "old_leader": old.name,
                "new_leader": new.name,
                "promoted_ms": promoted_ms,
                # Two writable servers at once? (Patroni stepped it down by itself.)
                "old_leader_writable": writable,
                **rejoin,
                "quiet_s": quiet,
            },
            postgres_discarded_before=fenced_before,
        )

    async def _rejoin(self, member: Member, since: int, *, started_again: bool) -> dict[str, Any]:
        """``member`` (started again if it died) follows the new leader: whether it did
        within REJOIN_DEADLINE_S, and whether Patroni rewound it to (its log from byte
        ``since``, where the fault began)."""
        cluster = self.stack.cluster
        if started_again:
            await asyncio.to_thread(cluster.spawn, member)
        began = time.monotonic()
        rejoined = await asyncio.to_thread(cluster.wait_for_member, member, REJOIN_DEADLINE_S)
        return {
            "rejoined": rejoined,
            "rejoin_ms": round((time.monotonic() - began) * 1000),
            "rewound": member.rewound(since),
        }


async def _writable(member: Member) -> bool:
    """Whether ``member``'s PostgreSQL (asked directly, not through the cut links) takes
    writes now: False when it is a standby, or down (Patroni stops a leader that lost
    etcd: "demoting self because DCS is not accessible")."""
    with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        conn = await asyncpg.connect(member.dsn(), timeout=2)
        try:
            row = await conn.fetchrow(fence_sql.SELECT_IS_PRIMARY)
            return row is not None and bool(row["primary"])
        finally:
            await conn.close()
    return False
