"""The ledger's SQL: issues, marks of use, releases, the retained issues, lookups.

Values are always bind parameters ($1..$n, documented above each constant); ``{cold}``,
``{seq}`` and ``{ledger}`` are filled by ``shared.stores.postgres.sql.for_type``.
"""

from __future__ import annotations

from typing import Final

# Issue entries as keysync passes them, one array item per entry: $1 its keys
# (space-separated), $2 its time, $3 its clients (space-separated, one per key, or one
# for all), $4 its Idempotency-Key, $5 its entry ID. One row per key; ``nth`` and
# ``kth`` its place in stream order (of two entries issuing one key, the earlier is
# inserted first).
_ISSUE_BATCH: Final = """
batch AS (
    SELECT k.key, e.issued_at, coalesce(k.client, split_part(e.clients, ' ', 1)) AS client,
           e.idempotency_key, e.entry_id, e.nth, k.kth
    FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[])
        WITH ORDINALITY AS e(keys, issued_at, clients, idempotency_key, entry_id, nth)
    CROSS JOIN LATERAL unnest(string_to_array(e.keys, ' '), string_to_array(e.clients, ' '))
        WITH ORDINALITY AS k(key, client, kth)
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
    ORDER BY b.nth, b.kth
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

# $1-$5: the issue entries (_ISSUE_BATCH). Run after INSERT_LEDGER_ISSUED when it
# inserted fewer keys than the entries hold: the issues ("<entry> <key>") no row holds
# under their entry (issued twice, or released since): what a restore must not insert
# (FORCE_ISSUED).
SELECT_NOT_INSERTED: Final = (
    "WITH"
    + _ISSUE_BATCH
    + """
SELECT b.entry_id || ' ' || b.key AS issue FROM batch AS b
WHERE NOT EXISTS (SELECT 1 FROM {ledger} AS l WHERE l.key = b.key AND l.entry_id = b.entry_id)
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
RETURNING l.key, l.used_at, l.used_by
"""

# $1 keys, $2 release times, $3 releasing clients, $4 whether each may release any key
# (arrays), $5 id type. A key neither used nor released yet, by the client it was issued
# to (or one with ledger permission), is recorded released (never by a release older
# than its issue row, never a quarantined key); returns the keys released now, with
# what was recorded.
RELEASE_LEDGER: Final = """
UPDATE {ledger} AS l SET released_at = u.released_at, released_by = u.client
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bool[])
    AS u(key, released_at, client, admin)
WHERE l.key = u.key AND l.used_at IS NULL AND l.released_at IS NULL
  AND u.released_at >= l.issued_at AND (u.admin OR l.client = u.client)
  AND NOT EXISTS (
      SELECT 1 FROM kd_quarantined_keys AS q WHERE q.id_type = $5 AND q.key = u.key
  )
RETURNING l.key, l.released_at, l.released_by
"""

# $1: id type; $2-$5 as RELEASE_LEDGER's $1-$4, $6: the release entries (array). A type
# with reissue_released: the issue row moves to kd_released_issues (REQUEUE_RELEASED
# puts the key back in the cold table later); a release entry already recorded there
# (applied again) does nothing, nor does the release of a quarantined key. Returns the
# keys released now.
RELEASE_TO_HISTORY: Final = """
WITH released AS (
    DELETE FROM {ledger} AS l
    USING unnest($2::text[], $3::timestamptz[], $4::text[], $5::bool[], $6::text[])
        AS u(key, released_at, client, admin, entry)
    WHERE l.key = u.key AND l.used_at IS NULL AND l.released_at IS NULL
      AND u.released_at >= l.issued_at AND (u.admin OR l.client = u.client)
      AND NOT EXISTS (
          SELECT 1 FROM kd_quarantined_keys AS q WHERE q.id_type = $1 AND q.key = u.key
      )
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
RETURNING key, released_at, released_by, release_entry, recorded_at
"""

# $1: id type, $2: seconds. Releases PostgreSQL recorded longer ago than that (its own
# clock: recorded_at, never the Redis server's released_at) are settled, each once
# (requeued_at is set in the same statement): the key goes back to the cold table only
# when no issue of it is live in the ledger, it is not quarantined and no import
# excluded it (each keeps it out for good: requeue_discarded; the caller holds
# LOCK_IMPORT_SHARED, so an import running meanwhile finds the key in the cold table or
# this finds it excluded). One row per release settled: its key and issue, whether it
# was discarded, when, and whether the key went back (``back``).
REQUEUE_RELEASED: Final = """
WITH due AS (
    UPDATE kd_released_issues AS r
    SET requeued_at = now(),
        requeue_discarded = EXISTS (SELECT 1 FROM {ledger} AS l WHERE l.key = r.key)
            OR EXISTS (
                SELECT 1 FROM kd_quarantined_keys AS q
                WHERE q.id_type = r.id_type AND q.key = r.key
            )
            OR EXISTS (SELECT 1 FROM kd_excluded AS e WHERE e.id_type = $1 AND e.key = r.key)
    WHERE r.id_type = $1 AND r.requeued_at IS NULL
      AND r.recorded_at <= now() - make_interval(secs => $2::double precision)
    RETURNING r.key, r.entry_id, r.requeue_discarded, r.requeued_at
),
back AS (
    INSERT INTO {cold} (key) SELECT key FROM due WHERE NOT requeue_discarded
    ON CONFLICT (key) DO NOTHING
    RETURNING key
)
SELECT due.key, due.entry_id, due.requeue_discarded, due.requeued_at,
       EXISTS (SELECT 1 FROM back WHERE back.key = due.key) AS back
FROM due
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

# $1: id type, $2: reason. ``ledger-resume --accept-loss``: every key the lost history
# may have changed is quarantined (kd_quarantined_keys): each issue still open (neither
# used nor released) and each release not requeued yet. Returns the keys quarantined now.
QUARANTINE_UNVOUCHED: Final = """
INSERT INTO kd_quarantined_keys (id_type, key, reason)
SELECT $1, key, $2 FROM {ledger} WHERE used_at IS NULL AND released_at IS NULL
UNION
SELECT $1, key, $2 FROM kd_released_issues WHERE id_type = $1 AND requeued_at IS NULL
ON CONFLICT DO NOTHING
RETURNING key
"""

# No parameters. How many keys are quarantined, per type.
COUNT_QUARANTINED: Final = (
    "SELECT id_type, count(*) AS keys FROM kd_quarantined_keys GROUP BY id_type ORDER BY 1"
)

# $1: key, $2: id type. Whether the key is quarantined (kd_quarantined_keys).
IS_QUARANTINED: Final = (
    "SELECT EXISTS (SELECT 1 FROM kd_quarantined_keys WHERE id_type = $2 AND key = $1)"
)

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
# marks found, marks applied, and the marks applied (keys, times, clients).
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
    RETURNING l.key, l.used_at, l.used_by
)
SELECT (SELECT count(*) FROM early) AS found, (SELECT count(*) FROM applied) AS applied,
       (SELECT coalesce(array_agg(key), ARRAY[]::text[]) FROM applied) AS keys,
       (SELECT coalesce(array_agg(used_at), ARRAY[]::timestamptz[]) FROM applied) AS times,
       (SELECT coalesce(array_agg(used_by), ARRAY[]::text[]) FROM applied) AS clients
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


# --- the ledger's one history (docs/reliability.md) --------------------------------
# A ledger transaction's writes, as recorded in the ledger log, are applied again by a
# restore with the statements below: each writes what the decision wrote, deciding
# nothing (the rows it finds are the ones the decision found: the restore starts from
# the link the lost ones followed).

# $1-$5: the issue entries (_ISSUE_BATCH), $6: issues not to insert
# (SELECT_NOT_INSERTED's "<entry> <key>"; a bare key, as links logged by earlier
# versions name them, skips every issue of that key).
FORCE_ISSUED: Final = (
    "WITH"
    + _ISSUE_BATCH
    + """
INSERT INTO {ledger} (key, issued_at, client, idempotency_key, entry_id)
SELECT b.key, b.issued_at, b.client, b.idempotency_key, b.entry_id FROM batch AS b
WHERE NOT (b.entry_id || ' ' || b.key = ANY($6::text[]) OR b.key = ANY($6::text[]))
ORDER BY b.nth, b.kth
ON CONFLICT (key) DO NOTHING
"""
)

# $1: id type, $2: keys whose issue rows were inserted (their early marks go), $3-$5:
# the marks applied (keys, times, clients).
FORCE_EARLY_MARKS_APPLIED: Final = """
WITH gone AS (
    DELETE FROM kd_ledger_early_marks WHERE id_type = $1 AND key = ANY($2::text[])
)
UPDATE {ledger} AS l SET used_at = u.used_at, used_by = u.used_by
FROM unnest($3::text[], $4::timestamptz[], $5::text[]) AS u(key, used_at, used_by)
WHERE l.key = u.key
"""

# $1 keys, $2 use times, $3 clients (arrays): marks of use as they were applied.
FORCE_USED: Final = """
UPDATE {ledger} AS l SET used_at = u.used_at, used_by = u.used_by
FROM unnest($1::text[], $2::timestamptz[], $3::text[]) AS u(key, used_at, used_by)
WHERE l.key = u.key
"""

# $1 keys, $2 release times, $3 clients (arrays): releases recorded in place.
FORCE_RELEASED: Final = """
UPDATE {ledger} AS l SET released_at = u.released_at, released_by = u.released_by
FROM unnest($1::text[], $2::timestamptz[], $3::text[]) AS u(key, released_at, released_by)
WHERE l.key = u.key
"""

# $1: id type; $2 keys, $3 release times, $4 clients, $5 release entries, $6 when
# PostgreSQL recorded each (arrays): issue rows moved to kd_released_issues.
FORCE_RELEASED_TO_HISTORY: Final = """
WITH released AS (
    DELETE FROM {ledger} AS l
    USING unnest($2::text[], $3::timestamptz[], $4::text[], $5::text[], $6::timestamptz[])
        AS u(key, released_at, client, entry, recorded_at)
    WHERE l.key = u.key
    RETURNING l.key, l.issued_at, l.client, l.idempotency_key, l.entry_id,
              u.released_at, u.client AS released_by, u.entry AS release_entry, u.recorded_at
)
INSERT INTO kd_released_issues
    (id_type, key, issued_at, client, idempotency_key, entry_id, released_at, released_by,
     release_entry, recorded_at)
SELECT $1, key, issued_at, client, idempotency_key, entry_id, released_at, released_by,
       release_entry, recorded_at
FROM released
ON CONFLICT DO NOTHING
"""

# $1: id type; $2 keys, $3 their issues' entries, $4 whether discarded, $5 when
# (arrays): releases settled by a requeue. The key is not put back in the cold table:
# a restore follows a fence, which discarded the cold tier.
FORCE_REQUEUED: Final = """
UPDATE kd_released_issues AS r
SET requeued_at = u.requeued_at, requeue_discarded = u.discarded
FROM unnest($2::text[], $3::text[], $4::bool[], $5::timestamptz[])
    AS u(key, entry_id, discarded, requeued_at)
WHERE r.id_type = $1 AND r.key = u.key AND r.entry_id = u.entry_id
"""

# $1: id type, $2 entries, $3 outcomes (arrays). The outcome of each status change a
# client waits for, decided once (a restore's wins: it is the one answered).
INSERT_OUTCOMES: Final = """
INSERT INTO kd_outcomes (id_type, entry_id, outcome)
SELECT $1, * FROM unnest($2::text[], $3::text[])
ON CONFLICT (id_type, entry_id) DO NOTHING
"""
FORCE_OUTCOMES: Final = """
INSERT INTO kd_outcomes (id_type, entry_id, outcome)
SELECT $1, * FROM unnest($2::text[], $3::text[])
ON CONFLICT (id_type, entry_id) DO UPDATE SET outcome = EXCLUDED.outcome
"""

# $1: id type, $2: entries. The outcomes decided already (an entry applied again).
SELECT_OUTCOMES: Final = """
SELECT entry_id, outcome FROM kd_outcomes WHERE id_type = $1 AND entry_id = ANY($2::text[])
"""

# $1: link id, $2: lane, $3: the link it follows (null: the lane's first).
INSERT_LINK: Final = """
INSERT INTO kd_chain_links (id, lane, prev) VALUES ($1::uuid, $2, $3::uuid)
ON CONFLICT (id) DO NOTHING
"""

# $1: link ids, $2: lane, $3: the links they follow (arrays): links a restore applied.
INSERT_LINKS: Final = """
INSERT INTO kd_chain_links (id, lane, prev)
SELECT u.id, $2, u.prev FROM unnest($1::uuid[], $3::uuid[]) AS u(id, prev)
ON CONFLICT (id) DO NOTHING
"""

# $1: link id. Whether this history holds it.
HOLDS_LINK: Final = "SELECT EXISTS (SELECT 1 FROM kd_chain_links WHERE id = $1::uuid)"

# $1: link ids. Those this history holds.
SELECT_HELD_LINKS: Final = "SELECT id::text FROM kd_chain_links WHERE id = ANY($1::uuid[])"

# $1: lane, $2: link. In a fence's transaction: the lane's ledger waits for a restore up
# to the link (replacing one an earlier fence left pending: the record moved past it).
MARK_RESTORE: Final = """
UPDATE kd_sync_clock
SET ledger_restore = jsonb_set(ledger_restore, ARRAY[$1::text], to_jsonb($2::text))
WHERE id = 1
"""

# $1: lane. Clears a lane's pending restore (an operator accepting what the log lost).
CLEAR_RESTORE: Final = (
    "UPDATE kd_sync_clock SET ledger_restore = ledger_restore - $1::text WHERE id = 1"
)

# $1: seconds. Links and outcomes older than that (never a lane's newest link: a fence
# asks whether this history holds it).
PRUNE_LINKS: Final = """
DELETE FROM kd_chain_links
WHERE applied_at < now() - make_interval(secs => $1::double precision)
  AND NOT id::text IN (SELECT value FROM kd_sync_clock, jsonb_each_text(ledger_heads))
"""
PRUNE_OUTCOMES: Final = """
DELETE FROM kd_outcomes WHERE decided_at < now() - make_interval(secs => $1::double precision)
"""
