#!/bin/sh
# Run once by the postgres image when it creates the database, after 10-roles.sql made
# the roles: sets each role's password from env/postgres.env (deploy/compose/init-env.sh).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v owner="$KD_OWNER_PASSWORD" -v keygen="$KD_KEYGEN_PASSWORD" \
  -v keysync="$KD_KEYSYNC_PASSWORD" -v dispenser="$KD_DISPENSER_PASSWORD" \
  -v status="$KD_STATUS_PASSWORD" <<'SQL'
ALTER ROLE kd_owner PASSWORD :'owner';
ALTER ROLE kd_keygen PASSWORD :'keygen';
ALTER ROLE kd_keysync PASSWORD :'keysync';
ALTER ROLE kd_dispenser PASSWORD :'dispenser';
ALTER ROLE kd_status PASSWORD :'status';
SQL
