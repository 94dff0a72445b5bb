"""Every SQL statement keydispenser runs.

Values are always bind parameters ($1..$n, documented above each constant).
Identifiers derived from ID-type names are validated and quoted by ``ident``
and substituted through ``str.format`` as ``{cold}`` / ``{seq}`` only.
"""

from __future__ import annotations

from typing import Final

from shared.domain.names import ID_TYPE_NAME


def ident(name: str) -> str:
    """A safely quoted identifier; refuses anything but a validated type-derived name."""
    bare = name
    for prefix in ("kd_cold_", "kd_seq_", "kd_ledger_"):
        bare = bare.removeprefix(prefix)
    if not ID_TYPE_NAME.fullmatch(bare):
        raise ValueError(f"refusing unsafe identifier {name!r}")
    return '"' + name + '"'


def cold_table_name(name: str) -> str:
    """The cold table's bare name, for APIs that quote it themselves (COPY)."""
    if not ID_TYPE_NAME.fullmatch(name):
        raise ValueError(f"refusing unsafe identifier {name!r}")
    return f"kd_cold_{name}"


def cold_table(name: str) -> str:
    return ident(f"kd_cold_{name}")


def sequence(name: str) -> str:
    return ident(f"kd_seq_{name}")


def ledger_table(name: str) -> str:
    return ident(f"kd_ledger_{name}")


def for_type(statement: str, name: str, **numbers: int) -> str:
    """``statement`` with the type's quoted identifiers (and integers) filled in."""
    ints = {key: int(value) for key, value in numbers.items()}
    return statement.format(
        cold=cold_table(name), seq=sequence(name), ledger=ledger_table(name), **ints
    )


# $1: lock id. Serialises concurrent `migrate` runs.
LOCK_MIGRATIONS: Final = "SELECT pg_advisory_xact_lock($1)"

# No parameters.
SELECT_SCHEMA_VERSION: Final = "SELECT coalesce(max(version), 0) FROM kd_schema_version"

# $1: version applied.
INSERT_SCHEMA_VERSION: Final = "INSERT INTO kd_schema_version (version) VALUES ($1)"

# $1: relation name. Whether a table exists (before migrations, kd_schema_version may not).
SELECT_TABLE_EXISTS: Final = "SELECT to_regclass($1) IS NOT NULL"

# $1: id type. The stored fingerprint (jsonb as text), if any.
SELECT_FINGERPRINT: Final = "SELECT fingerprint::text FROM kd_id_types WHERE name = $1"

# $1: id type, $2: fingerprint json. Records or replaces a fingerprint.
UPSERT_FINGERPRINT: Final = """
INSERT INTO kd_id_types (name, fingerprint) VALUES ($1, $2::jsonb)
ON CONFLICT (name) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, updated_at = now()
"""

# Identifiers only ({seq}); the numbers are computed integers from validated config.
# A type's sequence runs over its site's share of the counters, [minvalue, maxvalue]
# (the whole domain without a site), and stops at its end (KeyspaceExhausted).
CREATE_SEQUENCE: Final = (
    "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint INCREMENT BY {increment} "
    "MINVALUE {minvalue} MAXVALUE {maxvalue} START WITH {minvalue} NO CYCLE"
)
ALTER_SEQUENCE: Final = (
    "ALTER SEQUENCE {seq} INCREMENT BY {increment} MINVALUE {minvalue} MAXVALUE {maxvalue} "
    "START WITH {minvalue} RESTART WITH {minvalue}"
)

# The cold table is an insert-then-delete queue: vacuum it eagerly.
CREATE_COLD_TABLE: Final = """
CREATE TABLE IF NOT EXISTS {cold} (key text PRIMARY KEY)
WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05)
"""

# The cold table of a sequential type: byte-ordered keys, so its primary key index
# serves TAKE_BATCH_IN_ORDER.
CREATE_COLD_TABLE_IN_ORDER: Final = """
CREATE TABLE IF NOT EXISTS {cold} (key text COLLATE "C" PRIMARY KEY)
WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05)
"""

# Retiring a type (`keydispenser retire`): identifiers only.
DROP_COLD_TABLE: Final = "DROP TABLE IF EXISTS {cold}"
DROP_SEQUENCE: Final = "DROP SEQUENCE IF EXISTS {seq}"
DROP_LEDGER_TABLE: Final = "DROP TABLE IF EXISTS {ledger}"
# $1: id type. Its released issues (kept with its ledger, dropped with it).
DELETE_RELEASED_ISSUES: Final = "DELETE FROM kd_released_issues WHERE id_type = $1"
# Tables of every type's ledger share the kd_ledger_ prefix: a type may not take the
# name of a table that is not a type's (kd_ledger_early_marks).
LEDGER_PREFIX_TABLES: Final = frozenset({"early_marks"})
# No parameters. Every key left in a cold table.
COUNT_COLD: Final = "SELECT count(*) FROM {cold}"

# $1: id type. When it was retired (no row: never).
SELECT_RETIRED: Final = "SELECT retired_at FROM kd_retired_types WHERE name = $1"

# $1: id type. Its leases: how many, and the end of the highest (0: none).
SUMMARIZE_RANGES: Final = """
SELECT count(*) AS leased, coalesce(max(range_end), 0) AS highest
FROM kd_ranges WHERE id_type = $1
"""

# $1: id type. Forgets its leases (kd_ranges refers to its fingerprint row).
DELETE_RANGES: Final = "DELETE FROM kd_ranges WHERE id_type = $1"

# $1: id type. Forgets its fingerprint; returns it (jsonb as text), if there was one.
DELETE_FINGERPRINT: Final = "DELETE FROM kd_id_types WHERE name = $1 RETURNING fingerprint::text"

# $1: id type, $2: fingerprint json (or NULL), $3: ranges leased, $4: highest counter
# leased, $5: cold keys dropped. The tombstone of a retired type.
INSERT_RETIRED: Final = """
INSERT INTO kd_retired_types (name, fingerprint, ranges_leased, highest_counter, keys_discarded)
VALUES ($1, $2::jsonb, $3, $4, $5)
ON CONFLICT (name) DO NOTHING
"""

# The ledger of issued keys. entry_id is the Redis stream entry that recorded the
# issue: a redelivered entry conflicts with its own row, a duplicate issue with another's.
CREATE_LEDGER_TABLE: Final = """
CREATE TABLE IF NOT EXISTS {ledger} (
    key text PRIMARY KEY,
    issued_at timestamptz NOT NULL,
    client text NOT NULL,
    idempotency_key text,
    entry_id text NOT NULL,
    used_at timestamptz,
    used_by text,
    released_at timestamptz,
    released_by text
)
"""

# Ledger tables created before mark-used recorded who marked a key.
ADD_LEDGER_USED_BY: Final = "ALTER TABLE {ledger} ADD COLUMN IF NOT EXISTS used_by text"
# Ledger tables created before keys could be released (migration 5 adds them too).
ADD_LEDGER_RELEASED: Final = (
    "ALTER TABLE {ledger} ADD COLUMN IF NOT EXISTS released_at timestamptz, "
    "ADD COLUMN IF NOT EXISTS released_by text"
)

# Issue entries as keysync passes them, one array item per entry: $1 its keys
# (space-separated), $2 its time, $3 its clients (space-separated, one per key, or one
# for all), $4 its Idempotency-Key, $5 its entry ID. One row per key.
_ISSUE_BATCH: Final = """
batch AS (
    SELECT k.key, e.issued_at, coalesce(k.client, split_part(e.clients, ' ', 1)) AS client,
           e.idempotency_key, e.entry_id
    FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[])
        AS e(keys, issued_at, clients, idempotency_key, entry_id)
    CROSS JOIN LATERAL unnest(string_to_array(e.keys, ' '), string_to_array(e.clients, ' '))
        AS k(key, client)
    WHERE k.key IS NOT NULL
)"""

# $1-$5: the issue entries (_ISSUE_BATCH), $6: id type. How many keys were inserted;
# the others were already in the ledger, or their issue by that very entry was
# released since (an entry applied again never revives a released issue, wherever its
# row went).
INSERT_LEDGER_ISSUED: Final = (
    "WITH"
    + _ISSUE_BATCH
    + """,
inserted AS (
    INSERT INTO {ledger} (key, issued_at, client, idempotency_key, entry_id)
    SELECT b.key, b.issued_at, b.client, b.idempotency_key, b.entry_id FROM batch AS b
    WHERE NOT EXISTS (
        SELECT 1 FROM kd_released_issues AS r
        WHERE r.id_type = $6 AND r.key = b.key AND r.entry_id = b.entry_id
    )
    ON CONFLICT (key) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM inserted
"""
)

# $1-$5: the issue entries (_ISSUE_BATCH), $6: id type. Run after INSERT_LEDGER_ISSUED
# when it inserted fewer keys than the entries hold: the keys the ledger holds issued
# by another entry, that are no replay of a released issue (the same entry found among
# released issues): keys issued twice.
SELECT_ISSUED_TWICE: Final = (
    "WITH"
    + _ISSUE_BATCH
    + """
SELECT b.key FROM batch AS b JOIN {ledger} AS l ON l.key = b.key
WHERE l.entry_id <> b.entry_id
  AND NOT EXISTS (
      SELECT 1 FROM kd_released_issues AS r
      WHERE r.id_type = $6 AND r.key = b.key AND r.entry_id = b.entry_id
  )
"""
)

# $1: id type. Whether any "used" mark waits for its issue row (APPLY_EARLY_MARKS).
HAS_EARLY_MARKS: Final = "SELECT EXISTS (SELECT 1 FROM kd_ledger_early_marks WHERE id_type = $1)"

# $1: keys. The recorded stream entry and client of each (to tell redeliveries from
# duplicates, and a refused mark-used from one of a key never issued).
SELECT_LEDGER_ENTRIES: Final = (
    "SELECT key, entry_id, client, used_at FROM {ledger} WHERE key = ANY($1::text[])"
)

# $1 keys, $2 use times, $3 marking clients, $4 whether each marker may mark any key
# (arrays). Only the client a key was issued to, or one with ledger permission, marks it;
# the first use wins; a mark older than the issue row (one that belonged to an earlier
# issue of a key given back and issued again, applied twice) does nothing; returns keys
# newly marked used.
UPDATE_LEDGER_USED: Final = """
UPDATE {ledger} AS l SET used_at = u.used_at, used_by = u.client
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bool[]) AS u(key, used_at, client, admin)
WHERE l.key = u.key AND l.used_at IS NULL AND l.released_at IS NULL
  AND u.used_at >= l.issued_at AND (u.admin OR l.client = u.client)
RETURNING l.key
"""

# $1 keys, $2 release times, $3 releasing clients, $4 whether each may release any key
# (arrays). A key neither used nor released yet, by the client it was issued to (or one
# with ledger permission), is recorded released (never by a release older than its
# issue row); returns the keys released now.
RELEASE_LEDGER: Final = """
UPDATE {ledger} AS l SET released_at = u.released_at, released_by = u.client
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bool[])
    AS u(key, released_at, client, admin)
WHERE l.key = u.key AND l.used_at IS NULL AND l.released_at IS NULL
  AND u.released_at >= l.issued_at AND (u.admin OR l.client = u.client)
RETURNING l.key
"""

# $1: id type; $2-$5 as RELEASE_LEDGER's $1-$4, $6: the release entries (array). A type
# with reissue_released: the issue row moves to kd_released_issues (REQUEUE_RELEASED
# puts the key back in the cold table later); a release entry already recorded there
# (applied again) does nothing. Returns the keys released now.
RELEASE_TO_HISTORY: Final = """
WITH released AS (
    DELETE FROM {ledger} AS l
    USING unnest($2::text[], $3::timestamptz[], $4::text[], $5::bool[], $6::text[])
        AS u(key, released_at, client, admin, entry)
    WHERE l.key = u.key AND l.used_at IS NULL AND l.released_at IS NULL
      AND u.released_at >= l.issued_at AND (u.admin OR l.client = u.client)
      AND NOT EXISTS (
          SELECT 1 FROM kd_released_issues AS r
          WHERE r.id_type = $1 AND r.key = u.key AND r.release_entry = u.entry
      )
    RETURNING l.key, l.issued_at, l.client, l.idempotency_key, l.entry_id,
              u.released_at, u.client AS released_by, u.entry AS release_entry
)
INSERT INTO kd_released_issues
    (id_type, key, issued_at, client, idempotency_key, entry_id, released_at, released_by,
     release_entry)
SELECT $1, key, issued_at, client, idempotency_key, entry_id, released_at, released_by,
       release_entry
FROM released
ON CONFLICT DO NOTHING
RETURNING key
"""

# $1: id type, $2: seconds. Releases PostgreSQL recorded longer ago than that (its own
# clock: recorded_at, never the Redis server's released_at) are settled, each once
# (requeued_at is set in the same statement): the key goes back to the cold table only
# when no issue of it is live in the ledger (a live one, e.g. an issue applied again
# after a promotion, keeps it out for good: requeue_discarded). Returns the keys put back.
REQUEUE_RELEASED: Final = """
WITH due AS (
    UPDATE kd_released_issues AS r
    SET requeued_at = now(),
        requeue_discarded = EXISTS (SELECT 1 FROM {ledger} AS l WHERE l.key = r.key)
    WHERE r.id_type = $1 AND r.requeued_at IS NULL
      AND r.recorded_at <= now() - make_interval(secs => $2::double precision)
    RETURNING r.key, r.requeue_discarded
)
INSERT INTO {cold} (key) SELECT key FROM due WHERE NOT requeue_discarded
ON CONFLICT (key) DO NOTHING
RETURNING key
"""

# No parameters. The fence settles every release not requeued yet: the history this
# server lost may have requeued and issued it already (never issued again). Counts per
# type.
SETTLE_RELEASES: Final = """
WITH settled AS (
    UPDATE kd_released_issues SET requeued_at = now(), requeue_discarded = true
    WHERE requeued_at IS NULL
    RETURNING id_type
)
SELECT id_type, count(*) AS releases FROM settled GROUP BY id_type
"""

# $1: id type, $2: keys. Those of them whose last issue was given back and moved to
# kd_released_issues (a mark of use for them is refused, never kept waiting).
SELECT_RELEASED_KEYS: Final = (
    "SELECT DISTINCT key FROM kd_released_issues WHERE id_type = $1 AND key = ANY($2::text[])"
)

# $1: lock id. Taken by every ledger drain (one transaction per stream batch): a batch
# with marks of use or releases takes it alone (LOCK_LEDGER), a batch of issues only
# shares it with other such batches (LOCK_LEDGER_SHARED). An issue row and a "used"
# mark of its key, applied by two keysyncs at once, never miss each other; two batches
# of issues insert side by side (a key in both: the second waits on the first's row
# and then sees it, issued by another entry).
LOCK_LEDGER: Final = "SELECT pg_advisory_xact_lock($1)"
LOCK_LEDGER_SHARED: Final = "SELECT pg_advisory_xact_lock_shared($1)"

# $1: id type, $2 keys, $3 use times, $4 marking clients, $5 whether each may mark any
# key (arrays). Marks of keys with no issue row yet: kept until the row comes (each
# marker's first mark of a key).
INSERT_EARLY_MARKS: Final = """
INSERT INTO kd_ledger_early_marks (id_type, key, used_at, used_by, admin)
SELECT $1, * FROM unnest($2::text[], $3::timestamptz[], $4::text[], $5::bool[])
ON CONFLICT (id_type, key, used_by) DO NOTHING
"""

# $1: id type, $2: keys whose issue rows were just inserted. Applies, per key, the
# earliest of the marks that came before them by the client the key was issued to or
# one with ledger permission (the others are refused), and removes them all. One row:
# marks found, marks applied.
APPLY_EARLY_MARKS: Final = """
WITH early AS (
    DELETE FROM kd_ledger_early_marks AS e
    WHERE e.id_type = $1 AND e.key = ANY($2::text[])
    RETURNING e.key, e.used_at, e.used_by, e.admin
),
chosen AS (
    SELECT DISTINCT ON (early.key) early.key, early.used_at, early.used_by
    FROM early JOIN {ledger} AS l ON l.key = early.key
    WHERE (early.admin OR l.client = early.used_by) AND early.used_at >= l.issued_at
    ORDER BY early.key, early.used_at, early.used_by
),
applied AS (
    UPDATE {ledger} AS l SET used_at = chosen.used_at, used_by = chosen.used_by
    FROM chosen
    WHERE l.key = chosen.key AND l.used_at IS NULL
    RETURNING l.key
)
SELECT (SELECT count(*) FROM early) AS found, (SELECT count(*) FROM applied) AS applied
"""

# $1: seconds. Marks that waited longer for their issue row than any entry can be
# late (keys never issued, or whose issue entry Redis lost): forgotten, counted.
PRUNE_EARLY_MARKS: Final = """
WITH gone AS (
    DELETE FROM kd_ledger_early_marks
    WHERE received_at < now() - make_interval(secs => $1::double precision)
    RETURNING id_type
)
SELECT id_type, count(*) AS marks FROM gone GROUP BY id_type
"""

# No parameters. Marks waiting for their issue row, per type (status).
COUNT_EARLY_MARKS: Final = (
    "SELECT id_type, count(*) AS marks FROM kd_ledger_early_marks GROUP BY id_type"
)

# $1: key. One key's ledger row.
SELECT_LEDGER_KEY: Final = (
    "SELECT issued_at, client, idempotency_key, used_at, used_by, released_at, released_by "
    "FROM {ledger} WHERE key = $1"
)

# $1: id type, $2: key. Its latest issue that was given back (reissue_released), if any.
SELECT_RELEASED_ISSUE: Final = """
SELECT issued_at, client, released_at, released_by FROM kd_released_issues
WHERE id_type = $1 AND key = $2 ORDER BY released_at DESC LIMIT 1
"""

# No parameters. State of a type's sequence: last value handed out and whether any was.
SELECT_SEQUENCE_STATE: Final = "SELECT last_value, is_called FROM {seq}"

# Which database this is, across failovers: the cluster's system identifier (kept by
# every physical replica) and the database's name. A Redis namespace is bound to one.
DATABASE_IDENTITY: Final = (
    "(SELECT system_identifier FROM pg_control_system())::text || '/' || current_database()"
)
# The server's current timeline (pg_control_checkpoint() lags behind a fast promotion).
_TIMELINE: Final = "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"

# No parameters. This database's identity (DATABASE_IDENTITY).
SELECT_DATABASE_IDENTITY: Final = "SELECT " + DATABASE_IDENTITY

# The PostgreSQL fence's guard (docs/reliability.md, "PostgreSQL failover"), the first
# step of every statement that leases a range or takes a batch. It advances the sync
# clock and yields its stamp only when this server's history covers the record kept in
# Redis; otherwise it yields no row and the statement does nothing. The record names a
# history by (timeline, fork): on the record's own timeline a server passes only with
# the record's fork (a second server promoted to the same timeline number, or one
# restored from before a fence, has another) and a clock at least the record's; on a
# newer timeline only when it forked at or after the record's clock; on an older
# timeline never (a superseded primary that still takes writes).
# $1: record timeline, $2: record clock, $3: record fork, $4: 1 when the record needs a
# vouch (Redis lost it, or has none yet): nothing passes until the fence rebuilds it
# (VOUCH below, postgres_fence.py); 2 with several key groups (a record per type): the
# first write on a new timeline does not pass either, so that a new timeline is taken
# up only by ``settle``, judged against every group's record (one type's write, judged
# against its own record alone, would otherwise move the clock on past commits the
# new server lacks of another type); 0 otherwise.
_GUARD: Final = (
    """
WITH here AS (SELECT """
    + _TIMELINE
    + """ AS tl),
stamp AS (
    UPDATE kd_sync_clock AS c
    SET fork = CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END,
        timeline = here.tl,
        clock = c.clock + 1
    FROM here
    WHERE c.id = 1 AND CASE
        WHEN $4::int = 1 THEN false
        WHEN $4::int = 2 AND c.timeline <> here.tl THEN false
        WHEN here.tl = $1::bigint THEN c.clock >= $2::bigint
            AND (CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END) = $3::bigint
        WHEN here.tl > $1::bigint THEN
            (CASE WHEN c.timeline <> here.tl THEN c.clock ELSE c.fork END) >= $2::bigint
        ELSE false
    END
    RETURNING c.timeline, c.fork, c.clock, c.fences, """
    + DATABASE_IDENTITY
    + """ AS database
)"""
)

# $1-$4: the guard's. $5: id type, $6: range size, $7: lessee. A lease ends where the
# sequence does (its MAXVALUE + 1: the end of the domain, or of the site's share): a
# process still running with a configuration from before `migrate` gave the type a
# site never leases past the share the sequence now holds.
# Leases one range; no row when the guard refused (nothing leased). ``fences`` is the
# fence count the lease was made under (LOCK_FENCES).
LEASE_RANGE: Final = (
    _GUARD
    + """,
lease AS (
    INSERT INTO kd_ranges (id_type, range_start, range_end, leased_by)
    SELECT $5, v, LEAST(v + $6, (SELECT seqmax + 1 FROM pg_sequence
                                 WHERE seqrelid = '{seq}'::regclass)), $7
    FROM (SELECT nextval('{seq}') AS v WHERE EXISTS (SELECT 1 FROM stamp)) AS next
    RETURNING range_start, range_end
)
SELECT lease.range_start, lease.range_end,
       stamp.timeline, stamp.fork, stamp.clock, stamp.fences, stamp.database
FROM lease, stamp
"""
)

# No parameters. First in a COPY's transaction: the fence count, under a lock that
# the fence's LOCK_SYNC_CLOCK (FOR UPDATE) waits for and that takes and leases (FOR NO
# KEY UPDATE) do not: a fence waits for every COPY in flight, and a COPY that starts
# after a fence sees its count. A range leased under another count is not copied.
LOCK_FENCES: Final = "SELECT fences FROM kd_sync_clock WHERE id = 1 FOR KEY SHARE"

# $1: id type, $2: range start, $3: candidates, $4: accepted (both added to the
# range's totals), $5: true when this was the range's last slice (marks it filled).
ACCOUNT_RANGE: Final = """
UPDATE kd_ranges
SET candidates = coalesce(candidates, 0) + $3,
    accepted = coalesce(accepted, 0) + $4,
    filled_at = CASE WHEN $5 THEN now() ELSE filled_at END
WHERE id_type = $1 AND range_start = $2
"""

# A batch is taken in one transaction of two statements (``ColdStore.begin_take``):
# GUARD_TAKE, then TAKE_BATCH or TAKE_BATCH_IN_ORDER. The guard's UPDATE locks the
# clock row until the transaction ends, and every statement that deletes cold keys (the
# other keysyncs' takes, the fence's discard) runs behind that lock, so takes never
# overlap and each DELETE's snapshot, taken after the lock, sees every earlier take
# committed: its rows need no row locks (``FOR UPDATE SKIP LOCKED`` would write a lock
# record per row for nothing). A row is still deleted, and returned, at most once: that
# is the DELETE's own guarantee.
# $1-$4: the guard's. One row: the stamp; no row when the guard refused (roll back).
GUARD_TAKE: Final = _GUARD + "\nSELECT timeline, fork, clock, fences, database FROM stamp"

# $1: milliseconds, as text ("0": no limit). First in a take's transaction: how long it
# may sit idle while open (a next batch waiting for the push), and how long the server
# may wait for the client to acknowledge what it sent (a batch's keys). Past either the
# server ends the session and rolls the take back, so a keysync paused or cut off
# between its DELETE and its commit cannot hold the clock's row lock, and with it every
# other take and lease, until TCP gives up on the connection (15 minutes to hours).
# Both settings are the transaction's own (set_config's third argument).
LIMIT_IDLE_TAKE: Final = (
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true),"
    " set_config('tcp_user_timeout', $1, true)"
)

# $1: batch size. After GUARD_TAKE. Removes up to $1 keys; one row: how many, and the
# keys joined by newlines (NULL when none; keys never hold a newline). One text value
# costs the server and the driver less than an array of thousands.
TAKE_BATCH: Final = """
WITH taken AS (
    DELETE FROM {cold}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM {cold} LIMIT $1))
    RETURNING key
)
SELECT count(*) AS taken, string_agg(key, E'\\n') AS keys FROM taken
"""

# TAKE_BATCH for sequential types: the lowest keys first, returned in order (keys of a
# sequential type are zero-padded, so byte order is counter order).
TAKE_BATCH_IN_ORDER: Final = """
WITH taken AS (
    DELETE FROM {cold}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM {cold} ORDER BY key COLLATE "C" LIMIT $1))
    RETURNING key
)
SELECT count(*) AS taken, string_agg(key, E'\\n' ORDER BY key COLLATE "C") AS keys FROM taken
"""

# $1: cap. Cold inventory, counted up to $1 rows so the cost stays bounded.
COUNT_COLD_UP_TO: Final = "SELECT count(*) FROM (SELECT 1 FROM {cold} LIMIT $1) AS capped"

# $1: id type. Range bookkeeping for status.
SELECT_RANGE_STATS: Final = """
SELECT count(*) AS leased,
       count(filled_at) AS filled,
       coalesce(sum(candidates), 0) AS candidates,
       coalesce(sum(accepted), 0) AS accepted
FROM kd_ranges WHERE id_type = $1
"""

# $1: channel, $2: payload. Wakes keygen processes listening on the channel.
NOTIFY: Final = "SELECT pg_notify($1, $2)"
KEYGEN_CHANNEL: Final = "kd_keygen_wake"

# The fence itself, and the vouch (one transaction each; the row lock makes concurrent
# fencers and guarded statements wait for it).
# No parameters. Locks the clock row; the server's timeline and database identity.
LOCK_SYNC_CLOCK: Final = (
    """
SELECT c.timeline, c.fork, c.clock, c.fences, """
    + _TIMELINE
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
    + _TIMELINE
    + """ AS tl) AS here
WHERE c.id = 1
RETURNING c.timeline, c.fork, c.clock, c.fences, """
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

# $1: milliseconds, as text. First in a COPY's transaction: a keygen paused or cut off
# in it (holding the lock a fence waits for) is ended by the server after $1.
LIMIT_COPY: Final = (
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true),"
    " set_config('statement_timeout', $1, true)"
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
RETURNING timeline, fork, clock, fences, """
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
