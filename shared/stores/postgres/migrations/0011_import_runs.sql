-- An import under way (`keydispenser import`, docs/operations.md, "Moving from OpenG2P's
-- or MOSIP's generator"): one row per type and source while it reads, records and
-- sweeps, so that a run killed midway is resumed by the next, not started over.
--
-- The rows read so far wait in the run's staging table (kd_stage_<source>_<type>,
-- created by the import, dropped when it records them). origin: what was read (the
-- source's place and tables, or the file's path, size and time; NULL for standard
-- input, never resumed): a run of another origin starts over. cursor: where the next
-- chunk starts (a table and the last ID read from it, or a file's byte offset), moved in
-- the transaction that copies the chunk. tally: the rows' counts so far (read, invalid,
-- unknown statuses, staged). recorded: once the rows are recorded (excluded, removed
-- from the cold table, in the ledger), what that did; only the hot list's sweep is left.
--
-- UNLOGGED, as the staging tables: a crash of the server empties both together (the
-- next run starts over), and their rows never cost WAL.
CREATE UNLOGGED TABLE IF NOT EXISTS kd_import_runs (
    id_type     text NOT NULL,
    source      text NOT NULL,
    origin      text,
    cursor      jsonb,
    tally       jsonb NOT NULL,
    recorded    jsonb,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id_type, source)
);
