-- PostgreSQL roles for keydispenser, one per process, least privilege
-- (docs/security.md, "PostgreSQL roles").
-- Run once as a superuser, connected to the database keydispenser will use (create it
-- first: CREATE DATABASE keydispenser;), before the first `keydispenser migrate`:
--   psql -v ON_ERROR_STOP=1 -d keydispenser -f deploy/postgres/roles.sql
-- Two environments on one server: give each its own role names with a prefix (the
-- same value as `postgres_role_prefix` in that environment's configuration):
--   PGOPTIONS='-c kd.role_prefix=kd_staging' psql -v ON_ERROR_STOP=1 -d kd_staging -f ...
-- Idempotent, and safe to re-run on a database set up by an earlier release (it takes
-- back the broad default privileges those gave). Set passwords afterwards
-- (ALTER ROLE kd_keygen PASSWORD '...';) unless the server authenticates otherwise
-- (certificates, IAM).
--
--   <prefix>_owner      migrate, retire, fence-postgres: owns the schema and every object
--   <prefix>_keygen     keygen and fill: leases ranges, writes keys it never reads back
--   <prefix>_keysync    keysync: takes batches, the ledger's only writer
--   <prefix>_dispenser  dispensers: ledger lookups; never a key still to be handed out
--   <prefix>_status     keydispenser status, monitoring: reads the record, counts keys
--
-- This script only creates the roles and lets them connect and use the schema. Which
-- table, sequence and function each may use is granted by `keydispenser migrate` (as
-- the owner, on every object it creates; shared/stores/postgres/grants.py), which also
-- revokes anything else a process role holds: rerun migrate after creating a role.

DO $$
DECLARE
    prefix text := coalesce(nullif(current_setting('kd.role_prefix', true), ''), 'kd');
    process text;
    role text;
    processes text[] := ARRAY['keygen', 'keysync', 'dispenser', 'status'];
    members text;
BEGIN
    IF prefix !~ '^[a-z][a-z0-9_]{0,30}$' THEN
        RAISE EXCEPTION 'kd.role_prefix % is not a role prefix (a lower-case letter, then up to 30 of a-z, 0-9, _)', prefix;
    END IF;
    FOREACH process IN ARRAY ARRAY['owner'] || processes LOOP
        role := prefix || '_' || process;
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role) THEN
            EXECUTE format('CREATE ROLE %I LOGIN', role);
        END IF;
        -- Plan every statement for the tables as they are now (the processes ask for it
        -- when they connect too; set here, it holds behind a pooler that drops the ask).
        EXECUTE format('ALTER ROLE %I IN DATABASE %I SET plan_cache_mode = force_custom_plan',
                       role, current_database());
    END LOOP;
    SELECT string_agg(quote_ident(prefix || '_' || p), ', ') INTO members FROM unnest(processes) AS p;

    -- Connect, nothing more: no temporary tables, no schemas of their own.
    EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('REVOKE ALL ON DATABASE %I FROM %s', current_database(), members);
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %s', current_database(), members);
    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', current_database(), prefix || '_owner');

    -- migrate creates its objects in the public schema, owned by the owner role. Only
    -- the owner creates there; the process roles may name what is in it.
    EXECUTE format('ALTER SCHEMA public OWNER TO %I', prefix || '_owner');
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    EXECUTE format('REVOKE CREATE ON SCHEMA public FROM %s', members);
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %s', members);

    -- Earlier releases granted every table and sequence to every process role through
    -- default privileges; take them back (migrate grants each object by itself).
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public REVOKE ALL ON TABLES FROM %s',
                   prefix || '_owner', members);
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public REVOKE ALL ON SEQUENCES FROM %s',
                   prefix || '_owner', members);
    -- Functions are executable by PUBLIC unless said otherwise: not the owner's.
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %I REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC',
                   prefix || '_owner');
END $$;
