-- Keys whose history the ledger cannot vouch for (docs/operations.md, "KdLedgerHalted").
--
-- `keydispenser ledger-resume --accept-loss` gives up ledger transactions a PostgreSQL
-- promotion lost and the ledger log could not restore: any key they may have changed
-- (every issue still open, every release not requeued yet) is quarantined here in the
-- same transaction. A release of a quarantined key is refused (its outcome says so), and
-- it is never requeued: it is never handed out again. A mark of use is still applied
-- (its holder keeps it; nobody else gets it).
CREATE TABLE IF NOT EXISTS kd_quarantined_keys (
    id_type         text NOT NULL,
    key             text NOT NULL,
    quarantined_at  timestamptz NOT NULL DEFAULT now(),
    reason          text NOT NULL,
    PRIMARY KEY (id_type, key)
);
