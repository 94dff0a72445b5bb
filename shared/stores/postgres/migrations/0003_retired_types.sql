-- ID types retired by `keydispenser retire` (shared/stores/schema.py): their cold table,
-- sequence, ranges and fingerprint are gone; this row keeps what they were and stops
-- the name from being used again (the same name and permutation key would generate
-- the same keys again).
CREATE TABLE IF NOT EXISTS kd_retired_types (
    name             text PRIMARY KEY,
    retired_at       timestamptz NOT NULL DEFAULT now(),
    fingerprint      jsonb,
    ranges_leased    bigint NOT NULL,
    highest_counter  bigint NOT NULL,
    keys_discarded   bigint NOT NULL
);
