"""The cold tier's SQL: migrations, sequences, ranges, takes; the quoting of type-derived
identifiers every statement uses. The fence's statements are in ``shared.stores.fence.sql``,
the ledger's in ``shared.stores.ledger.sql``.

Values are always bind parameters ($1..$n, documented above each constant).
Identifiers derived from ID-type names are validated and quoted by ``ident``
and substituted through ``str.format`` as ``{cold}`` / ``{seq}`` only.
"""

from __future__ import annotations

import re
from typing import Final

from shared.domain.names import ID_TYPE_NAME
from shared.stores.fence.sql import GUARD


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

# No parameters. State of a type's sequence: last value handed out and whether any was.
SELECT_SEQUENCE_STATE: Final = "SELECT last_value, is_called FROM {seq}"

# $1-$4: the guard's. $5: id type, $6: range size, $7: lessee. A lease ends where the
# sequence does (its MAXVALUE + 1: the end of the domain, or of the site's share): a
# process still running with a configuration from before `migrate` gave the type a
# site never leases past the share the sequence now holds.
# Leases one range; no row when the guard refused (nothing leased). ``fences`` is the
# fence count the lease was made under (LOCK_FENCES).
LEASE_RANGE: Final = (
    GUARD
    + """,
lease AS (
    INSERT INTO kd_ranges (id_type, range_start, range_end, leased_by)
    SELECT $5, v, LEAST(v + $6, (SELECT seqmax + 1 FROM pg_sequence
                                 WHERE seqrelid = '{seq}'::regclass)), $7
    FROM (SELECT nextval('{seq}') AS v WHERE EXISTS (SELECT 1 FROM stamp)) AS next
    RETURNING range_start, range_end
)
SELECT lease.range_start, lease.range_end,
       stamp.timeline, stamp.fork, stamp.clock, stamp.fences, stamp.heads, stamp.database
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

# $1: batch size, $2: id type. After GUARD_TAKE. Removes up to $1 keys; one row: how
# many, the keys joined by newlines (NULL when none; keys never hold a newline; one text
# value costs the server and the driver less than an array of thousands), and the
# type's import epoch, read in the same statement as the keys (push.lua refuses the
# batch once an import set a later one).
TAKE_BATCH: Final = """
WITH taken AS (
    DELETE FROM {cold}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM {cold} LIMIT $1))
    RETURNING key
)
SELECT count(*) AS taken, string_agg(key, E'\\n') AS keys,
       (SELECT coalesce(max(epoch), 0) FROM kd_import_epochs WHERE id_type = $2) AS epoch
FROM taken
"""

# TAKE_BATCH for sequential types: the lowest keys first, returned in order (keys of a
# sequential type are zero-padded, so byte order is counter order).
TAKE_BATCH_IN_ORDER: Final = """
WITH taken AS (
    DELETE FROM {cold}
    WHERE ctid = ANY (ARRAY(SELECT ctid FROM {cold} ORDER BY key COLLATE "C" LIMIT $1))
    RETURNING key
)
SELECT count(*) AS taken, string_agg(key, E'\\n' ORDER BY key COLLATE "C") AS keys,
       (SELECT coalesce(max(epoch), 0) FROM kd_import_epochs WHERE id_type = $2) AS epoch
FROM taken
"""

# $1: id type, $2: cap. Cold inventory, counted up to $2 rows so the cost stays bounded,
# by the owner's function (keygen and status count keys they may not read).
COUNT_COLD_UP_TO: Final = "SELECT kd_cold_depth($1, $2)"

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

# No parameters. The server process a statement ran on: one client connection answered
# by two is pooled per transaction (connect.pooled_per_transaction).
SELECT_BACKEND_PID: Final = "SELECT pg_backend_pid()"

# $1: milliseconds, as text. First in a COPY's transaction: a keygen paused or cut off
# in it (holding the lock a fence waits for) is ended by the server after $1.
LIMIT_COPY: Final = (
    "SELECT set_config('idle_in_transaction_session_timeout', $1, true),"
    " set_config('statement_timeout', $1, true)"
)


# --- imports: IDs another system issued (docs/operations.md, "Moving from OpenG2P's or
# MOSIP's generator") ----------------------------------------------------------------

# $1: id type. An import holds this lock (exclusive) while it removes the IDs it excludes
# from the type's cold table; every transaction that puts keys in that table (keygen's
# COPY, keysync's requeue) holds it shared and reads the exclusions after taking it: a
# key lands either before the import (removed by it) or after (dropped as excluded).
# The two-integer form keeps these locks apart from the one-bigint migration lock.
_IMPORT_LOCK_SPACE: Final = 0x6B64696D  # "kdim"
LOCK_IMPORT: Final = f"SELECT pg_advisory_xact_lock({_IMPORT_LOCK_SPACE}, hashtext($1))"
LOCK_IMPORT_SHARED: Final = (
    f"SELECT pg_advisory_xact_lock_shared({_IMPORT_LOCK_SPACE}, hashtext($1))"
)

# $1: id type, $2: first counter, $3: end (excluded). The excluded keys of a counter
# range (one index range scan).
SELECT_EXCLUDED_IN_RANGE: Final = """
SELECT key FROM kd_excluded WHERE id_type = $1 AND counter >= $2 AND counter < $3
"""

# $1: id type, $2: the first counter not leased, $3: the end of the share. Excluded
# counters still ahead of the sequence (the headroom they take).
COUNT_EXCLUDED_BETWEEN: Final = """
SELECT count(*) FROM kd_excluded WHERE id_type = $1 AND counter >= $2 AND counter < $3
"""

# An import's staging table: where the rows it read wait until it records them (one per
# type and source, kept across a killed run: kd_import_runs). The bare name, for COPY.
_STAGING_NAME: Final = re.compile(r"^kd_stage_[a-z0-9]{1,12}_[a-z][a-z0-9_]{0,40}$")


def staging_table_name(name: str, source: str) -> str:
    """The staging table of an import of ``source`` into the type ``name`` (bare)."""
    bare = f"kd_stage_{source}_{name}"
    if not _STAGING_NAME.fullmatch(bare):
        raise ValueError(f"refusing unsafe identifier {bare!r}")
    return bare


def for_import(statement: str, name: str, source: str) -> str:
    """``statement`` with the type's identifiers and the import's staging table filled in."""
    staging = '"' + staging_table_name(name, source) + '"'
    return statement.format(cold=cold_table(name), ledger=ledger_table(name), staging=staging)


# No parameters (identifiers: {staging}). Creates the staging table, unlogged (a crash
# empties it with kd_import_runs: the next run starts over).
CREATE_IMPORT_STAGING: Final = """
CREATE UNLOGGED TABLE {staging} (
    key text NOT NULL,
    counter bigint,
    status text NOT NULL,
    created_at timestamptz,
    updated_at timestamptz,
    issued boolean NOT NULL,
    used boolean NOT NULL
)
"""
# No parameters (identifiers: {staging}).
DROP_IMPORT_STAGING: Final = "DROP TABLE IF EXISTS {staging}"
IMPORT_STAGING_COLUMNS: Final = (
    "key",
    "counter",
    "status",
    "created_at",
    "updated_at",
    "issued",
    "used",
)

# No parameters (identifiers: {staging}). Keys the source holds more than once: how many,
# rows beyond the first, and a few of them.
SUMMARIZE_STAGED_DUPLICATES: Final = """
SELECT count(*) AS keys, coalesce(sum(n - 1), 0) AS extra,
       (array_agg(key ORDER BY key))[1:5] AS examples
FROM (SELECT key, count(*) AS n FROM {staging} GROUP BY key HAVING count(*) > 1) AS d
"""

# The staged rows, one per key (the newest of a key the source holds twice), in key
# order (the index's: inserted in order, its pages are written once).
_STAGED_ONCE: Final = """
SELECT DISTINCT ON (key) key, counter, status, created_at, updated_at
FROM {staging} ORDER BY key, updated_at DESC NULLS LAST
"""

# $1: id type, $2: source (identifiers: {staging}). Rewrites the exclusions the source
# now says something else of (a new status, new times). After LOCK_IMPORT. Status tag:
# UPDATE n.
UPDATE_CHANGED_EXCLUDED: Final = f"""
UPDATE kd_excluded AS e
SET source = $2, status = s.status, created_at = s.created_at, updated_at = s.updated_at,
    imported_at = now()
FROM ({_STAGED_ONCE}) AS s
WHERE e.id_type = $1 AND e.key = s.key
  AND (e.source, e.status, e.created_at, e.updated_at)
      IS DISTINCT FROM ($2, s.status, s.created_at, s.updated_at)
"""

# $1: id type, $2: source (identifiers: {staging}). Excludes every staged ID not excluded
# yet. After LOCK_IMPORT (no other import inserts meanwhile). Status tag: INSERT 0 n.
INSERT_NEW_EXCLUDED: Final = f"""
INSERT INTO kd_excluded (id_type, key, counter, source, status, created_at, updated_at)
SELECT $1, s.key, s.counter, $2, s.status, s.created_at, s.updated_at
FROM ({_STAGED_ONCE}) AS s
WHERE NOT EXISTS (SELECT 1 FROM kd_excluded AS e WHERE e.id_type = $1 AND e.key = s.key)
"""

# No parameters (identifiers: {cold}, {staging}). Removes the staged IDs from the cold
# table; how many.
DELETE_STAGED_COLD: Final = """
WITH gone AS (
    DELETE FROM {cold} AS c USING {staging} AS s WHERE c.key = s.key RETURNING 1
)
SELECT count(*) FROM gone
"""

# $1: the API client the imported issues belong to, $2: the entry id they are recorded
# under (identifiers: {ledger}, {staging}). The source's issued IDs become issues of the
# ledger, used when the source says so (MOSIP's ASSIGNED), at the source's times; an ID
# the ledger already holds is left as it is (counted by SUMMARIZE_ISSUED_HERE). How many
# were added.
INSERT_IMPORTED_ISSUES: Final = """
WITH issued AS (
    SELECT DISTINCT ON (key) key, created_at, updated_at, used
    FROM {staging} WHERE issued ORDER BY key, updated_at DESC NULLS LAST
),
written AS (
    INSERT INTO {ledger} (key, issued_at, client, entry_id, used_at, used_by)
    SELECT key, coalesce(updated_at, created_at, now()), $1, $2,
           CASE WHEN used THEN coalesce(updated_at, created_at, now()) END,
           CASE WHEN used THEN $1 END
    FROM issued
    ON CONFLICT (key) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM written
"""

# $1: the entry id imported issues are recorded under (identifiers: {ledger}, {staging}).
# Staged IDs this ledger holds as issued by keydispenser itself: both systems issued them
# (how many, a few).
SUMMARIZE_ISSUED_HERE: Final = """
SELECT count(*) AS keys, (array_agg(l.key ORDER BY l.key))[1:5] AS examples
FROM {ledger} AS l
WHERE l.entry_id <> $1 AND l.key IN (SELECT key FROM {staging})
"""

# $1: id type, $2: source. The run an earlier import of them left (kd_import_runs),
# locked until the caller's transaction ends.
SELECT_IMPORT_RUN: Final = """
SELECT origin, cursor, tally, recorded FROM kd_import_runs
WHERE id_type = $1 AND source = $2
FOR UPDATE
"""

# $1: id type, $2: source, $3: origin (NULL: never resumed), $4: tally (jsonb). A run
# from the start, in place of any earlier one.
START_IMPORT_RUN: Final = """
INSERT INTO kd_import_runs (id_type, source, origin, cursor, tally)
VALUES ($1, $2, $3, NULL, $4::jsonb)
ON CONFLICT (id_type, source) DO UPDATE
SET origin = $3, cursor = NULL, tally = $4::jsonb, recorded = NULL, started_at = now(),
    updated_at = now()
"""

# $1: id type, $2: source, $3: the cursor the caller last moved it to (jsonb, NULL at the
# start), $4: the new cursor, $5: the tally. Moves the run on past a chunk staged in the
# same transaction; UPDATE 0 when another import moved it meanwhile.
ADVANCE_IMPORT_RUN: Final = """
UPDATE kd_import_runs SET cursor = $4::jsonb, tally = $5::jsonb, updated_at = now()
WHERE id_type = $1 AND source = $2 AND recorded IS NULL
  AND cursor IS NOT DISTINCT FROM $3::jsonb
"""

# $1: id type, $2: source, $3: what recording the staged rows did (jsonb). Only the hot
# list's sweep is left.
MARK_IMPORT_RECORDED: Final = """
UPDATE kd_import_runs SET recorded = $3::jsonb, updated_at = now()
WHERE id_type = $1 AND source = $2
"""

# $1: id type, $2: source. The run is over (swept, refused or discarded).
DELETE_IMPORT_RUN: Final = "DELETE FROM kd_import_runs WHERE id_type = $1 AND source = $2"

# $1: id type. Moves the type's import epoch on; returns it.
ADVANCE_IMPORT_EPOCH: Final = """
INSERT INTO kd_import_epochs (id_type, epoch) VALUES ($1, 1)
ON CONFLICT (id_type) DO UPDATE SET epoch = kd_import_epochs.epoch + 1
RETURNING epoch
"""

# $1: id type, $2: keys (text[]). Those of the keys an import excluded.
SELECT_EXCLUDED_AMONG: Final = """
SELECT key FROM kd_excluded WHERE id_type = $1 AND key = ANY ($2::text[])
"""

# $1: id type. The type's import epoch (0: never imported into).
SELECT_IMPORT_EPOCH: Final = """
SELECT coalesce((SELECT epoch FROM kd_import_epochs WHERE id_type = $1), 0)
"""

# $1: id type (identifiers: {ledger}). Every issue of a ledger type, for `keydispenser
# export`: the ledger's, then the issues given back and moved out of it
# (kd_released_issues); entry_id names the stream entry, or the import, that recorded it.
EXPORT_LEDGER: Final = """
SELECT key,
       CASE WHEN released_at IS NOT NULL THEN 'released'
            WHEN used_at IS NOT NULL THEN 'used' ELSE 'issued' END AS status,
       client, issued_at, used_at, used_by, released_at, released_by, entry_id
FROM {ledger}
UNION ALL
SELECT key, 'released', client, issued_at, NULL, NULL, released_at, released_by, entry_id
FROM kd_released_issues WHERE id_type = $1
"""
EXPORT_COLUMNS: Final = (
    "key",
    "status",
    "client",
    "issued_at",
    "used_at",
    "used_by",
    "released_at",
    "released_by",
    "entry_id",
)
