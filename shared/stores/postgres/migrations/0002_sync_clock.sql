-- The PostgreSQL fence (docs/reliability.md, "PostgreSQL failover").
-- One row: a clock advanced in the same statement as every range lease and every
-- keysync batch. Its last committed value is also recorded in Redis after commit; a
-- PostgreSQL that is behind that record has lost commits (a promoted asynchronous
-- replica). timeline is the server timeline of the last write, fork the clock value
-- this server's history started from when it first wrote on that timeline.
CREATE TABLE IF NOT EXISTS kd_sync_clock (
    id        smallint PRIMARY KEY CHECK (id = 1),
    timeline  bigint NOT NULL,
    fork      bigint NOT NULL,
    clock     bigint NOT NULL
);
INSERT INTO kd_sync_clock (id, timeline, fork, clock) VALUES (1, 0, 0, 0)
ON CONFLICT (id) DO NOTHING;

-- Every time the fence discarded cold inventory and advanced sequences.
CREATE TABLE IF NOT EXISTS kd_fence_events (
    id              bigserial PRIMARY KEY,
    fenced_at       timestamptz NOT NULL DEFAULT now(),
    reason          text NOT NULL,
    keys_discarded  bigint NOT NULL,
    detail          jsonb NOT NULL
);
