-- The ledger as a system of record (docs/reliability.md, "The ledger").
--
-- release_entry: the stream entry that released the issue. A release applied again (a
-- redelivery, a Redis restart from an older snapshot, a replay after a PostgreSQL
-- promotion) is recognised by it, wherever the key has gone since.
-- recorded_at: when PostgreSQL applied the release. reissue_after_s is judged on
-- PostgreSQL's clock alone (released_at is the Redis server's).
-- requeue_discarded: a PostgreSQL fence settled the release instead of requeueing it
-- (the key may have been requeued and issued in the history the promotion lost: it is
-- never issued again).
ALTER TABLE kd_released_issues
    ADD COLUMN IF NOT EXISTS release_entry text,
    ADD COLUMN IF NOT EXISTS recorded_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS requeue_discarded boolean NOT NULL DEFAULT false;

