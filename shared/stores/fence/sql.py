"""The PostgreSQL fence's SQL: the guard every range lease and batch take runs behind, the
fence, the vouch, the database's identity and its binding to a Redis namespace.

Values are always bind parameters ($1..$n, documented above each constant); ``{cold}``,
``{seq}`` and ``{ledger}`` are filled by ``shared.stores.postgres.sql.for_type``.
"""

from __future__ import annotations

from typing import Final

# Which database this is, across failovers: the cluster's system identifier (kept by
# every physical replica) and the database's name. A Redis namespace is bound to one.
DATABASE_IDENTITY: Final = (
    "(SELECT system_identifier FROM pg_control_system())::text || '/' || current_database()"
)
# The server's current timeline (pg_control_checkpoint() lags behind a fast promotion).
TIMELINE: Final = "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"

# No parameters. This database's identity (DATABASE_IDENTITY).
SELECT_DATABASE_IDENTITY: Final = "SELECT " + DATABASE_IDENTITY

# The PostgreSQL fence's guard (docs/reliability.md, "PostgreSQL failover"), the first
# step of every statement that leases a range or takes a batch, and the last of every
# ledger transaction. It advances the sync clock and yields its stamp only when this
# server's history covers the record kept in Redis; otherwise it yields no row and the
# statement does nothing. The record names a history by (timeline, fork): on the
# record's own timeline a server passes only with the record's fork (a second server
# promoted to the same timeline number, or one restored from before a fence, has
# another) and a clock at least the record's; on a newer timeline only when it forked at
# or after the record's clock; on an older timeline never (a superseded primary that
# still takes writes). Every stamp carries the ledger's heads (kd_sync_clock, as
# ``heads``): a stamp recorded in Redis names the ledger as it was at that clock.
# $1: record timeline, $2: record clock, $3: record fork, $4: flags (Record.guard_args):
# 1 when the record needs a vouch (Redis lost it, or has none yet): nothing passes until
# the fence rebuilds it (VOUCH below, postgres_fence.py); 2 with several key groups (a
# record per type): the first write on a new timeline does not pass either, so that a
# new timeline is taken up only by ``settle``, judged against every group's record (one
# type's write, judged against its own record alone, would otherwise move the clock on
# past commits the new server lacks of another type); 4 for a ledger transaction: it
# passes only on the record's own timeline (a promoted server adopts its timeline
# first: a stamp of the old primary's landing late then fences it, or is refused,
# instead of the ledger deciding on a history that lacks what was answered).
_GUARD_WHERE: Final = """WHERE c.id = 1 AND CASE
        WHEN ($4::int & 1) = 1 THEN false
        WHEN ($4::int & 2) = 2 AND c.timeline <> here.tl THEN false
        WHEN ($4::int & 4) = 4 AND here.tl <> $1::bigint THEN false
        WHEN here.tl = $1::bigint THEN c.clock >= $2::bigint
            AND (CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END) = $3::bigint
        WHEN here.tl > $1::bigint THEN
            (CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END) >= $2::bigint
        ELSE false
    END"""
_STAMP_COLUMNS: Final = (
    "c.timeline, c.fork, c.clock, c.fences, c.ledger_heads::text AS heads, "
    + DATABASE_IDENTITY
    + " AS database"
)


def _guard(sets: str = "", where: str = "", returning: str = "") -> str:
    """The guard's CTE (``stamp``), with what a variant sets, checks and returns more."""
    return (
        "\nWITH here AS (SELECT "
        + TIMELINE
        + """ AS tl),
stamp AS (
    UPDATE kd_sync_clock AS c
    SET fork = CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END,
        timeline = here.tl,
        clock = c.clock + 1"""
        + sets
        + "\n    FROM here\n    "
        + _GUARD_WHERE
        + where
        + "\n    RETURNING "
        + _STAMP_COLUMNS
        + returning
        + "\n)"
    )


GUARD: Final = _guard()

# The last statement of every ledger transaction: the guard (always with flag 4), and
# the lane's chain moved on to this transaction's link. A lane with a restore pending
# (a fence found its record ahead of this server) passes only for that restore itself
# (its target, $7), which clears it; a restore of another target (one a later fence
# replaced) is refused.
# $1-$4: the guard's; $5: lane (the key group's namespace), $6: this link's id,
# $7: the restore's target ('' for any other ledger transaction). One row: the stamp,
# and ``prev``: the link it follows (kd_sync_clock.ledger_prev is set in the same
# UPDATE from the row it locked: a concurrent transaction's link, committed while this
# one waited, is seen). No row: refused (roll back).
GUARD_LEDGER: Final = (
    _guard(
        sets=""",
        ledger_prev = c.ledger_heads ->> $5::text,
        ledger_heads = jsonb_set(c.ledger_heads, ARRAY[$5::text], to_jsonb($6::text)),
        ledger_restore = CASE WHEN $7::text <> '' THEN c.ledger_restore - $5::text
                              ELSE c.ledger_restore END""",
        where="\n      AND coalesce(c.ledger_restore ->> $5::text, '') IN ('', $7::text)",
        returning=", c.ledger_prev AS prev",
    )
    + "\nSELECT timeline, fork, clock, fences, heads, database, prev FROM stamp\n"
)

# No parameters. The clock row as LOCK_SYNC_CLOCK has it, unlocked (why a ledger
# transaction's guard refused; whether a lookup's snapshot is covered by the record).
SELECT_LEDGER_STATE: Final = (
    """
SELECT c.timeline, c.fork, c.clock, c.fences, c.ledger_heads::text AS heads,
       c.ledger_restore::text AS restore_to, """
    + TIMELINE
    + " AS here, "
    + DATABASE_IDENTITY
    + """ AS database
FROM kd_sync_clock AS c WHERE c.id = 1
"""
)


# A batch is taken in one transaction of two statements (``ColdStore.begin_take``):
# GUARD_TAKE, then TAKE_BATCH or TAKE_BATCH_IN_ORDER. The guard's UPDATE locks the
# clock row until the transaction ends, and every statement that deletes cold keys (the
# other keysyncs' takes, the fence's discard) runs behind that lock, so takes never
# overlap and each DELETE's snapshot, taken after the lock, sees every earlier take
# committed: its rows need no row locks (``FOR UPDATE SKIP LOCKED`` would write a lock
# record per row for nothing). A row is still deleted, and returned, at most once: that
# is the DELETE's own guarantee.
# $1-$4: the guard's. One row: the stamp; no row when the guard refused (roll back).
GUARD_TAKE: Final = GUARD + "\nSELECT timeline, fork, clock, fences, heads, database FROM stamp"

# The fence itself, and the vouch (one transaction each; the row lock makes concurrent
# fencers and guarded statements wait for it).
# No parameters. Locks the clock row; the server's timeline and database identity.
LOCK_SYNC_CLOCK: Final = (
    """
SELECT c.timeline, c.fork, c.clock, c.fences, c.ledger_heads::text AS heads,
       c.ledger_restore::text AS restore_to, """
    + TIMELINE
    + " AS here, "
    + DATABASE_IDENTITY
    + """ AS database
FROM kd_sync_clock AS c WHERE c.id = 1 FOR UPDATE
"""
)

# No parameters. After LOCK_SYNC_CLOCK found that this server has not forked since its
# last guarded write: a guarded write of its own, whose stamp the record is rebuilt from.
VOUCH: Final = (
    """
UPDATE kd_sync_clock AS c
SET fork = CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END,
    timeline = here.tl,
    clock = c.clock + 1
FROM (SELECT """
    + TIMELINE
    + """ AS tl) AS here
WHERE c.id = 1
RETURNING c.timeline, c.fork, c.clock, c.fences, c.ledger_heads::text AS heads,
          c.ledger_restore::text AS restore_to, """
    + DATABASE_IDENTITY
    + """ AS database
"""
)

# No parameters. Every pooled type this database holds (migrated, not retired), with
# what its sequence says: the fence covers them all, whatever the configuration of
# the process that runs it (a rolling update may have added one it does not know).
SELECT_FENCED_TYPES: Final = """
SELECT t.name, s.increment_by, s.min_value, s.max_value, s.last_value,
       to_regclass('kd_cold_' || t.name) IS NOT NULL AS has_cold
FROM kd_id_types AS t
JOIN pg_sequences AS s
  ON s.schemaname = current_schema() AND s.sequencename = 'kd_seq_' || t.name
ORDER BY t.name
"""

# No parameters. This server, told apart from the other hosts of a multi-host DSN.
SELECT_SERVER_STARTED: Final = "SELECT pg_postmaster_start_time()::text"

# No parameters. Whether a server is a writable primary.
SELECT_IS_PRIMARY: Final = (
    "SELECT NOT pg_is_in_recovery() AS primary, pg_postmaster_start_time()::text AS started"
)

# $1: milliseconds, as text. First in a fence's (or a vouch's) transaction: it holds the
# clock row's lock, which every lease and take on the server waits for, so a process
# paused or cut off inside it must not hold it long: the server ends an idle session
# after $1, a send to a client gone after $1, and the lock is waited for at most $1.
LIMIT_FENCE: Final = (
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true),"
    " set_config('tcp_user_timeout', $1, true), set_config('lock_timeout', $1, true)"
)


# No parameters. The highest counter leased per type, as this server's history has it
# (a vouch rebuilds the record's leased:<type> from it).
SELECT_LEASED_HIGHS: Final = """
SELECT id_type, max(range_end) AS highest FROM kd_ranges GROUP BY id_type
"""

# No parameters. Discards a cold table's inventory (never reissued: the sequence moves
# on); returns how many keys that was.
DISCARD_COLD: Final = "WITH gone AS (DELETE FROM {cold} RETURNING 1) SELECT count(*) FROM gone"

# $1: the value the next nextval adds the increment to. Moves a sequence (forward only:
# the caller computes $1 from SELECT_SEQUENCE_STATE in the same transaction).
SET_SEQUENCE: Final = "SELECT setval('{seq}', $1::bigint, true)"

# $1: timeline, $2: the fork point and clock floor. After a fence, this server's history
# is declared to cover the record (its inventory is gone, its sequences moved past it),
# as a new history (a new fork: stamps taken before the fence no longer match it).
RESET_SYNC_CLOCK: Final = (
    """
UPDATE kd_sync_clock
SET timeline = $1, fork = GREATEST(clock, $2), clock = GREATEST(clock, $2) + 1,
    fences = fences + 1
WHERE id = 1
RETURNING timeline, fork, clock, fences, ledger_heads::text AS heads, """
    + DATABASE_IDENTITY
    + """ AS database
"""
)

# $1: reason, $2: keys discarded, $3: detail (json).
INSERT_FENCE_EVENT: Final = """
INSERT INTO kd_fence_events (reason, keys_discarded, detail) VALUES ($1, $2, $3::jsonb)
"""

# No parameters. The latest fence event, for status.
SELECT_LAST_FENCE: Final = """
SELECT fenced_at, reason, keys_discarded FROM kd_fence_events ORDER BY id DESC LIMIT 1
"""

# No parameters. Every cold key PostgreSQL fences have discarded (the drill's figure).
SUM_FENCE_DISCARDED: Final = "SELECT coalesce(sum(keys_discarded), 0) FROM kd_fence_events"

# No parameters. The sync clock, for status.
SELECT_SYNC_CLOCK: Final = "SELECT timeline, fork, clock, fences FROM kd_sync_clock WHERE id = 1"

# $1: Redis namespace. Binds this database to it on first use; returns the namespace it
# is bound to (one namespace, one database).
BIND_NAMESPACE: Final = """
WITH bound AS (
    INSERT INTO kd_binding (id, redis_namespace) VALUES (1, $1)
    ON CONFLICT (id) DO NOTHING
    RETURNING redis_namespace
)
SELECT redis_namespace FROM bound
UNION ALL SELECT redis_namespace FROM kd_binding WHERE id = 1
LIMIT 1
"""
