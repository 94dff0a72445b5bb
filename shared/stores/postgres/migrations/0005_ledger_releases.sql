-- Released keys (MOSIP's UNASSIGNED, docs/api.md): a key its client gave back.
--
-- Every ledger table gains when and by whom its key was released: a released key is
-- never marked used, and, unless its type sets reissue_released, never issued again.
DO $$
DECLARE
    ledger text;
BEGIN
    FOR ledger IN
        SELECT tablename FROM pg_tables
        WHERE schemaname = current_schema()
          AND tablename LIKE 'kd\_ledger\_%'
          AND tablename <> 'kd_ledger_early_marks'
    LOOP
        EXECUTE format(
            'ALTER TABLE %I ADD COLUMN IF NOT EXISTS released_at timestamptz, '
            'ADD COLUMN IF NOT EXISTS released_by text',
            ledger
        );
    END LOOP;
END
$$;

-- Issues of keys given back by a type with reissue_released: the issue row moves here
-- when the release is applied (so that the key's next issue gets a row of its own and
-- the ledger keeps both), and the key goes back to the cold table once the release is
-- older than the type's reissue_after_s (requeued_at: when; once per release).
CREATE TABLE IF NOT EXISTS kd_released_issues (
    id_type          text NOT NULL,
    key              text NOT NULL,
    issued_at        timestamptz NOT NULL,
    client           text NOT NULL,
    idempotency_key  text,
    entry_id         text NOT NULL,
    released_at      timestamptz NOT NULL,
    released_by      text NOT NULL,
    requeued_at      timestamptz,
    PRIMARY KEY (id_type, key, entry_id)
);
CREATE INDEX IF NOT EXISTS kd_released_issues_due
    ON kd_released_issues (id_type, released_at) WHERE requeued_at IS NULL;
