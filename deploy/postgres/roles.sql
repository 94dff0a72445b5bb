-- PostgreSQL roles for keydispenser, one per process, least privilege.
-- Run once as a superuser, connected to the database keydispenser will use (create it
-- first: CREATE DATABASE keydispenser;), before the first `keydispenser migrate`:
--   psql -v ON_ERROR_STOP=1 -d keydispenser -f deploy/postgres/roles.sql
-- Idempotent. Set passwords afterwards (ALTER ROLE kd_keygen PASSWORD '...';) unless
-- the server authenticates otherwise (certificates, IAM); see docs/security.md.
--
--   kd_owner      migrate, retire, fence-postgres: owns every table and sequence
--   kd_keygen     keygen and fill: leases ranges, copies keys, may fence
--   kd_keysync    keysync: takes batches, drains the ledger, may fence
--   kd_dispenser  dispensers: ledger lookups (GET /v1/keys/{type}/{key}); reads, never writes
--   kd_status     keydispenser status, monitoring: reads everything, writes nothing
-- Per-type tables and sequences are created later by migrate (as kd_owner): default
-- privileges give the other roles theirs on every object kd_owner creates.

DO $$
DECLARE
    role text;
BEGIN
    FOREACH role IN ARRAY ARRAY['kd_owner', 'kd_keygen', 'kd_keysync', 'kd_dispenser', 'kd_status'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role) THEN
            EXECUTE format('CREATE ROLE %I LOGIN', role);
        END IF;
        -- Plan every statement for the tables as they are now (the processes ask for it
        -- when they connect too; set here, it holds behind a pooler that drops the ask).
        EXECUTE format('ALTER ROLE %I IN DATABASE %I SET plan_cache_mode = force_custom_plan',
                       role, current_database());
    END LOOP;
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO kd_keygen, kd_keysync, kd_dispenser, kd_status', current_database());
    EXECUTE format('GRANT ALL ON DATABASE %I TO kd_owner', current_database());
END $$;

-- migrate creates its objects in the public schema, owned by kd_owner.
ALTER SCHEMA public OWNER TO kd_owner;
GRANT USAGE ON SCHEMA public TO kd_keygen, kd_keysync, kd_dispenser, kd_status;

-- keygen and keysync: rows of every table (leases, the cold tier, the sync clock, the
-- fence's events, the ledger, the binding); their sequences (nextval, and setval when a
-- fence moves them on).
ALTER DEFAULT PRIVILEGES FOR ROLE kd_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO kd_keygen, kd_keysync;
ALTER DEFAULT PRIVILEGES FOR ROLE kd_owner IN SCHEMA public
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO kd_keygen, kd_keysync;
-- dispensers and status read.
ALTER DEFAULT PRIVILEGES FOR ROLE kd_owner IN SCHEMA public
    GRANT SELECT ON TABLES TO kd_dispenser, kd_status;
ALTER DEFAULT PRIVILEGES FOR ROLE kd_owner IN SCHEMA public
    GRANT SELECT ON SEQUENCES TO kd_status;
