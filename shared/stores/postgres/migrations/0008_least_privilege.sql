-- Least privilege (docs/security.md, "PostgreSQL roles").
--
-- How many keys a type's cold tier holds, counted by its owner for a role that may not
-- read them (keygen's watermarks, `keydispenser status`): up to ``cap`` rows. The name
-- is checked as every type name is; the function runs with the owner's rights and its
-- own search path. Which roles may call it is migrate's to grant (grants.py).
CREATE OR REPLACE FUNCTION kd_cold_depth(type_name text, cap bigint) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    found bigint;
BEGIN
    IF type_name !~ '^[a-z][a-z0-9_]{0,40}$' THEN
        RAISE EXCEPTION 'kd_cold_depth: % is not a type name', type_name;
    END IF;
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %I LIMIT $1) AS capped',
                   'kd_cold_' || type_name)
        INTO found USING cap;
    RETURN found;
END
$$;
REVOKE ALL ON FUNCTION kd_cold_depth(text, bigint) FROM PUBLIC;
