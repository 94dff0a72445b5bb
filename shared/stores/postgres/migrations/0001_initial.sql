-- Global tables. Per-ID-type objects (a sequence and a cold table each) are
-- created by `keydispenser migrate` from the configuration (shared/stores/schema.py).
CREATE TABLE IF NOT EXISTS kd_schema_version (
    version     integer PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per ID type: its keyspace fingerprint (invariant immutable-keyspace, docs/design.md).
CREATE TABLE IF NOT EXISTS kd_id_types (
    name         text PRIMARY KEY,
    fingerprint  jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Every leased counter range; filled_at stays NULL for a range whose keygen
-- died before committing it (its keys are wasted, never reissued).
CREATE TABLE IF NOT EXISTS kd_ranges (
    id_type      text NOT NULL REFERENCES kd_id_types (name),
    range_start  bigint NOT NULL,
    range_end    bigint NOT NULL,
    leased_by    text NOT NULL,
    leased_at    timestamptz NOT NULL DEFAULT now(),
    filled_at    timestamptz,
    candidates   integer,
    accepted     integer,
    PRIMARY KEY (id_type, range_start)
);
