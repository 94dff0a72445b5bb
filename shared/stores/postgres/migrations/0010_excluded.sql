-- IDs another system issued (`keydispenser import`, docs/operations.md, "Moving from
-- OpenG2P's or MOSIP's generator"): none of them is ever handed out.
--
-- kd_excluded: every ID an import saw, whatever its status there. counter: the counter
-- keygen would generate it from (NULL: none does), so that keygen drops the excluded
-- keys of a range with one indexed range query; source, status and the source's times:
-- what the ID was where it came from.
CREATE TABLE IF NOT EXISTS kd_excluded (
    id_type      text NOT NULL,
    key          text NOT NULL,
    counter      bigint,
    source       text NOT NULL,
    status       text NOT NULL,
    created_at   timestamptz,
    updated_at   timestamptz,
    imported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id_type, key)
);
CREATE INDEX IF NOT EXISTS kd_excluded_counter
    ON kd_excluded (id_type, counter) WHERE counter IS NOT NULL;

-- One row per type an import changed: its epoch, moved by every import in the
-- transaction that removes the excluded keys from the cold table. A keysync batch
-- reads it in the statement that takes its keys, and its push is refused by a Redis
-- that holds a later epoch (the import records its epoch there before it sweeps the
-- hot list): a batch taken before an import never lands after its sweep.
CREATE TABLE IF NOT EXISTS kd_import_epochs (
    id_type  text PRIMARY KEY,
    epoch    bigint NOT NULL
);
