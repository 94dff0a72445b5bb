-- Partitions, pauses and misconfiguration (docs/reliability.md).
--
-- fences: how many PostgreSQL fences this server's history has seen. A range lease
-- returns it, and every COPY of the range re-reads it under a lock the fence conflicts
-- with: keys of a range leased before a fence never land after it.
ALTER TABLE kd_sync_clock ADD COLUMN IF NOT EXISTS fences bigint NOT NULL DEFAULT 0;

-- The Redis namespace this database serves (one namespace, one database): written on
-- first use, and any process bringing another namespace is refused at start-up.
CREATE TABLE IF NOT EXISTS kd_binding (
    id               smallint PRIMARY KEY CHECK (id = 1),
    redis_namespace  text NOT NULL,
    bound_at         timestamptz NOT NULL DEFAULT now()
);

-- A ledger "used" mark that was applied before the issue row it marks (two keysyncs,
-- or one restarted, draining the stream out of order). It waits here, and is applied
-- in the transaction that inserts the issue row: applying is order-independent. One
-- row per marker: a mark by a client the key was not issued to never hides the
-- owner's (the earliest authorised one is applied).
CREATE TABLE IF NOT EXISTS kd_ledger_early_marks (
    id_type      text NOT NULL,
    key          text NOT NULL,
    used_at      timestamptz NOT NULL,
    used_by      text NOT NULL,
    admin        boolean NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id_type, key, used_by)
);
