"""keysync's ledger loop: the Redis stream applied to PostgreSQL, one ledger transaction
per batch, each a link of the ledger's one history (docs/reliability.md).

A ledger transaction decides its batch (``decide.apply``), passes the guard last
(``fence_sql.GUARD_LEDGER``: the lane's chain moves to this link; refused unless the
server is on the record's history and timeline, with no restore pending), copies what
it wrote to the ledger log in Redis before it commits, and is confirmed once committed
(``LedgerStream.confirm_link``: its stamp recorded, the outcomes of its status changes
published, its entries acknowledged). So:

- a decision is made once: an outcome is answered from what its transaction wrote;
  an entry applied again (a redelivery, a second keysync, an entry left pending) keeps
  the outcome written beside it;
- a PostgreSQL promotion that lost links is restored from the log, link by link, as
  written (``restore``), before the ledger decides anything else, as soon as the fence
  is seen: the loop looks at the record and the server at every turn, even with no
  entry to apply;
- the log is trimmed only by a confirmation the record accepts, which clears the
  restore pending (the guard passed nothing before it on that history); a restore that
  finds a link gone fails the ledger closed (``LedgerHalted``) instead of deciding
  again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from shared.domain.errors import LedgerHalted, PostgresBehind, StoreUnavailable
from shared.domain.idtypes import IdType
from shared.domain.tiers import Stamp
from shared.runtime import FaultPoint, no_fault
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import Record, SyncRecord
from shared.stores.fence.verdict import ClockRow, verdict
from shared.stores.ledger import sql as ledger_sql
from shared.stores.ledger.batch import Applied, parse
from shared.stores.ledger.decide import LEDGER_LOCK, apply, prune_early_marks, requeue
from shared.stores.ledger.replay import apply_ops
from shared.stores.ledger.stream import LedgerStream, Link
from shared.stores.postgres.cold_store import ColdStore, translated

log = logging.getLogger(__name__)
Work = Callable[[asyncpg.Connection], Awaitable[Applied]]
ATTEMPTS = 4  # a ledger transaction refused this often is left for the next turn
# Chain links and outcomes are kept this many times the log's retention (at least a day).
LINK_AGE_FACTOR = 4
MIN_LINK_AGE_S = 86_400.0


def durability_of(types: dict[str, IdType]) -> tuple[str, int, int]:
    """The strictest ledger durability of ``types``: (mode, replicas, wait ms)."""
    ranked = ("async", "replicated", "fsynced")
    asking = [t.config for t in types.values() if t.config.ledger]
    mode = max((c.ledger_durability for c in asking), key=ranked.index, default="async")
    if mode == "async":
        return mode, 0, 0
    strict = [c for c in asking if c.ledger_durability != "async"]
    return mode, max(c.ledger_replicas for c in strict), max(c.ledger_wait_ms for c in strict)


class _Refused(Exception):
    """The guard refused the ledger transaction (rolled back)."""


class LedgerDrain:
    """The ledger of one key group (its stream, its record, its lane of the chain).

    ``guard`` None: the PostgreSQL fence is switched off (a drill's control): batches
    are applied and acknowledged with no chain, no log and no restore.
    """

    def __init__(
        self,
        stream: LedgerStream,
        cold: ColdStore,
        types: dict[str, IdType],
        consumer: str,
        batch_size: int,
        claim_idle_s: float = 30.0,
        guard: GuardedCold | None = None,
        retain_s: float = 300.0,
        sync: SyncRecord | None = None,
        fault: FaultPoint = no_fault,
        watch_s: float = 1.0,
    ) -> None:
        self._stream = stream
        self._cold = cold
        self._types = types
        self._consumer = consumer
        self._batch_size = batch_size
        self._claim_idle_ms = int(claim_idle_s * 1000)
        self._guard = guard if guard is not None and guard.guarded else None
        self._retain_ms = int(retain_s * 1000)
        self._sync = sync
        self._fault = fault  # test-only fault points (KD_FAULT_POINT)
        # The type whose key group's record the transactions are judged against (one
        # group per drain: its types share it).
        self._lane_type = next(iter(sorted(types)), "")
        # How durable a link must be in the ledger log before its transaction commits:
        # the strictest ledger_durability of the group's types (``_link_durable``).
        self._durability = durability_of(types)
        # How often an idle loop asks PostgreSQL whether it is still the record's history
        # (keysync.ledger_watch_s: a promotion with no traffic is fenced within this).
        self._watch_s = watch_s
        self._watched = 0.0  # when PostgreSQL was last asked (monotonic)
        self.restored = 0  # links restored, in all
        self.halted = ""  # why the ledger is halted ("" : it is not)

    @property
    def lane(self) -> str:
        """The key group's namespace: its lane of the ledger's chain."""
        return self._stream.namespace

    @property
    def enabled(self) -> bool:
        return any(t.config.ledger for t in self._types.values())

    async def drain_once(self, block_ms: int) -> Applied | None:
        """Apply one batch (waiting up to ``block_ms`` for one); None when there was none.
        A pending restore, or a fence, comes first."""
        await self.watch()
        await self._stream.beat(self._consumer)
        # A batch that fails (not applied, or applied and not acknowledged) stays
        # pending under this consumer: the next read takes it again first.
        entries = await self._stream.read(
            self._consumer, self._batch_size, block_ms, self._claim_idle_ms
        )
        if not entries:
            return None
        self._fault("keysync.ledger_read")  # a batch read, nothing applied yet
        batch = parse(entries, self._types)
        applied = await self._transact(lambda conn: apply(conn, batch), [e for e, _ in entries])
        for name, keys in applied.duplicates.items():
            log.error(
                "duplicate_key_issued",
                extra={"id_type": name, "keys": keys[:10], "count": len(keys)},
            )
        return applied

    async def requeue_released(self) -> dict[str, int]:
        """Put keys given back longer ago than their type's ``reissue_after_s`` back in
        the cold table (types with ``reissue_released``), each once, in a ledger
        transaction per type; how many per type."""
        requeued: dict[str, int] = {}
        for name, id_type in self._types.items():
            if not (id_type.config.ledger and id_type.config.reissue_released):
                continue
            back: list[int] = []

            async def work(
                conn: asyncpg.Connection, id_type: IdType = id_type, back: list[int] = back
            ) -> Applied:
                done = Applied()
                back.append(await requeue(conn, id_type, done))
                return done

            await self._transact(work, [])
            if back and back[-1]:
                requeued[name] = back[-1]
        return requeued

    async def prune(self, max_age_s: float) -> int:
        """Forget "used" marks that waited longer than ``max_age_s`` for their issue row,
        and chain links and outcomes older than the log could restore; how many marks."""
        age = max(LINK_AGE_FACTOR * self._retain_ms / 1000, MIN_LINK_AGE_S)
        async with self._cold.connection() as conn, translated("ledger_prune"):
            marks = await prune_early_marks(conn, max_age_s)
            await conn.execute(ledger_sql.PRUNE_LINKS, age)
            await conn.execute(ledger_sql.PRUNE_OUTCOMES, age)
        return marks

    # --- the ledger transaction -------------------------------------------------------

    async def _transact(self, work: Work, entry_ids: list[str]) -> Applied:
        """``work`` in one ledger transaction, confirmed once committed. A refusal is
        explained and dealt with (a restore, an adoption, a fence), then tried again."""
        if self._guard is None:
            return await self._unguarded(work, entry_ids)
        for _ in range(ATTEMPTS):
            record = await self._guard.record(self._lane_type)
            try:
                return await self._once(record, work, entry_ids)
            except _Refused:
                await self._refused(record)
        raise PostgresBehind(f"ledger transaction of lane {self.lane} refused {ATTEMPTS} times")

    async def _once(
        self, record: Record, work: Work, entry_ids: list[str], restoring: str = ""
    ) -> Applied:
        """One ledger transaction: ``work``, the guard, the link logged, the commit, the
        confirmation. ``restoring``: a restore's target (the guard passes the restore
        pending only for it), '' for any other."""
        link = str(uuid.uuid4())
        async with self._cold.connection() as conn, translated("ledger"), conn.transaction():
            applied = await work(conn)
            args = [*record.guard_args(ledger=True), self.lane, link, restoring]
            row = await conn.fetchrow(fence_sql.GUARD_LEDGER, *args)
            if row is None:
                raise _Refused()
            prev = row["prev"] or ""
            await conn.execute(ledger_sql.INSERT_LINK, link, self.lane, prev or None)
            # Before the commit, the clock row's lock held: once committed, the link is
            # in the log (a restore never finds it missing unless trimmed or lost).
            await self._stream.add_link(link, prev, applied.ops)
            await self._link_durable()
        await self._confirm(Stamp.of(row), applied, entry_ids)
        return applied

    async def _link_durable(self) -> None:
        """With a type asking for ``replicated`` (or ``fsynced``) ledger durability: the
        link just added to the log is on the replicas (on disk) before the transaction
        commits, else it does not commit (StoreUnavailable: rolled back, its entries
        stay pending), so a Redis failover never loses a committed link a restore
        needs."""
        mode, replicas, wait_ms = self._durability
        if mode == "async":
            return
        if not await self._stream.wait_durable(self._lane_type, mode, replicas, wait_ms):
            raise StoreUnavailable(
                "redis",
                f"ledger link not {mode} on {replicas} replica(s) within {wait_ms} ms",
            )

    async def _confirm(self, stamp: Stamp, applied: Applied, entry_ids: list[str]) -> None:
        args = (stamp, applied.outcomes, entry_ids, self._retain_ms)
        status = await self._stream.confirm_link(*args)
        if status == "untrusted" and self._guard is not None:
            await self._guard.vouch()  # Redis lost the record: rebuilt from PostgreSQL
            status = await self._stream.confirm_link(*args)
        if status != "ok":
            # Committed on a history the record no longer follows: the entries stay
            # pending; the fence (and a restore) comes first at the next turn.
            raise PostgresBehind(f"ledger transaction not recorded: {status}")

    async def _unguarded(self, work: Work, entry_ids: list[str]) -> Applied:
        async with self._cold.connection() as conn, translated("ledger"), conn.transaction():
            applied = await work(conn)
        await self._stream.acknowledge(applied.outcomes, entry_ids)
        return applied

    async def _refused(self, record: Record) -> None:
        """Why the guard refused, as this server says, and what comes first: a restore
        pending, the record taken up to this server's timeline, or the fence."""
        state = await self._state()
        if state.restore_to.get(self.lane) or record.restore_to:
            await self.restore(state.restore_to.get(self.lane) or record.restore_to)
        else:
            await self._settle(state, record)

    async def _settle(self, state: ClockRow, record: Record) -> None:
        """A server whose history covers the record on a newer timeline takes that
        timeline up (a ledger transaction passes only on the record's own); any other
        refusal is the fence's to settle."""
        assert self._guard is not None
        if verdict(state, record) == "ok" and state.here != record.timeline:
            await settle(self._cold, self._guard.records, adopt=True)
        else:
            await self._guard.fence()

    async def _state(self) -> ClockRow:
        async with self._cold.connection() as conn, translated("ledger_state"):
            return ClockRow.of(await conn.fetchrow(fence_sql.SELECT_LEDGER_STATE))

    # --- watching, restoring ----------------------------------------------------------

    async def watch(self) -> None:
        """Check, before every batch, that the ledger may decide: a halt refuses; a
        restore pending runs now; and at most every ``watch_s`` PostgreSQL is asked
        whether its history is still the record's (a promotion with no traffic is
        fenced, then restored, at once)."""
        if self._guard is None or self._sync is None:
            return
        record = await self._sync.read()
        if record.ledger_halt:
            self.halted = record.ledger_halt
            raise LedgerHalted(record.ledger_halt)
        self.halted = ""
        if record.restore_to:
            await self.restore(record.restore_to)
            return
        if time.monotonic() - self._watched < self._watch_s:
            return
        self._watched = time.monotonic()
        state = await self._state()
        if state.restore_to.get(self.lane):
            await self.restore(state.restore_to[self.lane])
        elif verdict(state, record) not in ("ok", "vouch"):
            await self._guard.fence()
            record = await self._sync.read()
            if record.restore_to:
                await self.restore(record.restore_to)

    async def restore(self, target: str) -> int:
        """Write again every ledger link this server lacks up to ``target`` (the head the
        fence found it behind), as the log holds them, in one ledger transaction of its
        own (itself a link: a later promotion that loses it restores it again); the
        lane's pending restore is cleared with it. How many links were restored.
        LedgerHalted when a link is gone from the log.

        The links are found inside the transaction, under the ledger's lock: a restore
        another keysync committed meanwhile is seen (its links are held), so no link is
        written twice over what was decided since. Refused (this server lost its place
        again, or was promoted again: the fence or the timeline's adoption settles it
        first), it restores what is pending then (a fence may have replaced the target),
        or nothing when nothing is."""
        assert self._guard is not None
        restored: list[int] = []
        for _ in range(ATTEMPTS):
            record = await self._guard.record(self._lane_type)
            if record.ledger_halt:  # another keysync's restore found a link gone
                self.halted = record.ledger_halt
                raise LedgerHalted(record.ledger_halt)
            try:
                await self._once(record, self._restoring(target, restored), [], restoring=target)
                break
            except _Refused:
                state = await self._state()
                await self._settle(state, record)
                pending = await self._pending(await self._state())
                if not pending:
                    # Restored meanwhile (by another keysync): nothing is asked for now,
                    # and a target no longer pending may not be this history's at all.
                    return 0
                target = pending
        else:
            raise PostgresBehind(f"the ledger restore of lane {self.lane} was refused")
        links = restored[-1] if restored else 0
        self.restored += links
        log.warning(
            "ledger_restored_after_fence",
            extra={"lane": self.lane, "links": links, "target": target},
        )
        return links

    def _restoring(self, target: str, restored: list[int]) -> Work:
        """Return a restore's transaction body: under the ledger's lock, it finds the
        links this server lacks up to ``target`` (``_chain``), writes their operations
        again in order, and records the links as this history's own (INSERT_LINKS). How
        many it wrote is appended to ``restored``."""

        async def work(conn: asyncpg.Connection) -> Applied:
            await conn.execute(ledger_sql.LOCK_LEDGER, LEDGER_LOCK)
            chain = await self._chain(conn, target) if await self._asked(conn, target) else []
            ops = [op for link in chain for op in link.ops]
            await apply_ops(conn, ops)
            if chain:
                ids, prevs = [link.id for link in chain], [link.prev or None for link in chain]
                await conn.execute(ledger_sql.INSERT_LINKS, ids, self.lane, prevs)
            restored.append(len(chain))
            return Applied(ops=ops, restored=len(chain))

        return work

    async def _asked(self, conn: asyncpg.Connection, target: str) -> bool:
        """Whether a restore up to ``target`` is still asked for: pending on this server
        or in the record. Not, once another keysync restored it, or a fence put another
        in its place that was restored since (a server promoted back keeps the mark an
        earlier fence left it): walking to it then would find links this server holds
        only inside a restore's link, and halt for nothing."""
        state = ClockRow.of(await conn.fetchrow(fence_sql.SELECT_LEDGER_STATE))
        if state.restore_to.get(self.lane, "") == target:
            return True
        record = await self._sync.read() if self._sync is not None else None
        return record is not None and record.restore_to == target

    async def _pending(self, state: ClockRow) -> str:
        """The restore pending now: the record's, else this server's ("" : none)."""
        found = await self._sync.read() if self._sync is not None else None
        return (found.restore_to if found else "") or state.restore_to.get(self.lane, "")

    async def _chain(self, conn: asyncpg.Connection, target: str) -> list[Link]:
        """The links from the first one this server lacks up to ``target``, oldest
        first, walked back from the log; LedgerHalted (and the ledger halted) when the
        walk cannot reach a link this server holds."""
        if await conn.fetchval(ledger_sql.HOLDS_LINK, target):
            return []
        state = ClockRow.of(await conn.fetchrow(fence_sql.SELECT_LEDGER_STATE))
        own_head = state.heads.get(self.lane, "")
        found: list[Link] = []
        want = target
        async for link in self._stream.links_newest_first():
            if link.id != want:
                continue
            found.append(link)
            want = link.prev
            if not want:
                if not own_head:
                    return list(reversed(found))  # the lane's first link: all of it
                break
            if await conn.fetchval(ledger_sql.HOLDS_LINK, want):
                return list(reversed(found))
        reason = f"ledger link {want or '(start)'} of lane {self.lane} is gone from the log"
        await self._halt(reason)
        raise LedgerHalted(reason)

    async def _halt(self, reason: str) -> None:
        log.critical("ledger_halted", extra={"lane": self.lane, "reason": reason})
        self.halted = reason
        if self._sync is not None:
            await self._sync.halt_ledger(reason)
