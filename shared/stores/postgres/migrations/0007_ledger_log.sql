-- The ledger's one history (docs/reliability.md, "The ledger's one history").
--
-- Every ledger transaction (a drained batch, a requeue, a restore) is one link of a
-- chain per key group ("lane", the group's Redis key namespace): its id, and the id of
-- the link before it. What it wrote is copied to Redis before it commits (the ledger
-- log); a PostgreSQL promotion that lost links is restored from those copies, exactly
-- as written, instead of deciding their entries again.
--
-- ledger_heads: each lane's newest link, moved by the guard of every ledger
-- transaction under the clock row's lock, and returned with every stamp, so that a
-- stamp recorded in Redis names the ledger as it was at that clock.
-- ledger_prev: scratch for the guard (the head its transaction replaced).
-- ledger_restore: each lane a fence found behind the record: the link to restore up to;
-- ledger transactions of that lane wait until the restore cleared it.
ALTER TABLE kd_sync_clock
    ADD COLUMN IF NOT EXISTS ledger_heads jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS ledger_prev text,
    ADD COLUMN IF NOT EXISTS ledger_restore jsonb NOT NULL DEFAULT '{}';

-- Every link this history holds (applied here, or restored): a restore walks the log
-- back from the record's head to the first link found here. Old rows are pruned.
-- (Names outside kd_ledger_*: that prefix is every type's ledger table's.)
CREATE TABLE IF NOT EXISTS kd_chain_links (
    id          uuid PRIMARY KEY,
    lane        text NOT NULL,
    prev        uuid,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS kd_chain_links_age ON kd_chain_links (applied_at);

-- The outcome of each status change a client waits for (MOSIP's PUT): decided once,
-- in the transaction that applies it, and answered from here whenever its entry is
-- applied again (a redelivery, a second keysync, an entry left pending by a restore).
CREATE TABLE IF NOT EXISTS kd_outcomes (
    id_type     text NOT NULL,
    entry_id    text NOT NULL,
    outcome     text NOT NULL,
    decided_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id_type, entry_id)
);
CREATE INDEX IF NOT EXISTS kd_outcomes_age ON kd_outcomes (decided_at);
