"""The faults of PostgreSQL as a pair the drill promotes itself (``--postgres pair``):
a restart in place, a failover to a replica that missed commits, two primaries at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from keydispenser_ops.drill.faults import LAG_WINDOW_S, Drill, Fault, Outcome
from keydispenser_ops.drill.postgres import PostgresPair

SPLIT_S = 6.0  # postgres_split_brain: how long both primaries take writes
# postgres_split_brain: which processes stay on the old primary, in turn; the others go
# to the promoted one (each side has a keysync, so each applies the ledger).
SPLIT_SIDES = (
    (("keysync",), ("keygen", "keysync-2")),
    (("keygen", "keysync-2"), ("keysync",)),
)


@dataclass
class PairFaults:
    drill: Drill
    pair: PostgresPair

    def faults(self) -> dict[str, Fault]:
        return {
            "postgres_failover": self.postgres_failover,
            "restart_postgres": self.restart_postgres,
            "postgres_split_brain": self.postgres_split_brain,
        }

    async def restart_postgres(self) -> Outcome:
        primary = self.pair.pair()[0]
        await asyncio.to_thread(primary.stop, "immediate")
        await asyncio.sleep(1.0)
        await asyncio.to_thread(primary.start)
        return Outcome()

    async def postgres_failover(self) -> Outcome:
        """The replica falls behind under load, the primary dies, the replica is promoted:
        the new primary lacks leases and batches whose keys were already dispensed."""
        drill = self.drill
        fenced_before = await drill.postgres_discarded()
        dispensed = drill.load.dispensed
        await self.pair.pause_replication()
        await asyncio.sleep(LAG_WINDOW_S)
        in_lag = drill.load.dispensed - dispensed
        await self.pair.fail_over()
        await self.pair.wait_for_replica()
        quiet = await drill.quiet_ledger()
        return Outcome(
            {"keys_in_lag_window": in_lag, "quiet_s": quiet},
            postgres_discarded_before=fenced_before,
        )

    async def postgres_split_brain(self) -> Outcome:
        """The replica falls behind, then is promoted while the old primary stays up and
        writable: one of keygen and keysync stays on the old primary (its links to the
        new one cut), the other moves to the new one. After SPLIT_S the old primary is
        rebuilt as a replica of the new one."""
        drill = self.drill
        stays, moves = SPLIT_SIDES[drill.turn("postgres_split_brain") % len(SPLIT_SIDES)]
        fenced_before = await drill.postgres_discarded()
        await self.pair.pause_replication()
        await asyncio.sleep(LAG_WINDOW_S)
        old, new = self.pair.pair()
        await self.pair.promote_replica()
        for name in stays:
            drill.links.cut_postgres(name, new.port)  # it reaches only the old primary
        for name in moves:
            drill.links.cut_postgres(name, old.port, "reset")  # it reconnects to the new one
        try:
            await asyncio.sleep(SPLIT_S)
        finally:
            await self.pair.heal()  # the old primary is stopped and rebuilt
            drill.links.heal()
        await self.pair.wait_for_replica()
        quiet = await drill.quiet_ledger()
        return Outcome(
            {"stayed_on_old": list(stays), "moved_to_new": list(moves), "quiet_s": quiet},
            postgres_discarded_before=fenced_before,
        )
