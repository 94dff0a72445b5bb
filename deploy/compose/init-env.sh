#!/bin/sh
# Writes deploy/compose/env/: one env file per service, each with only what that service
# needs (a password per PostgreSQL role, the permutation key for migrate and keygen
# alone). Run once; it refuses to overwrite an existing env/ (the permutation key in it
# defines the keyspace: back it up where your other secrets live).
set -eu
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
env_dir="$here/env"
if [ -e "$env_dir" ]; then
  echo "init-env.sh: $env_dir exists; remove it first to start over (its permutation key defines the keyspace)" >&2
  exit 2
fi
secret() { head -c 32 /dev/urandom | base64 | tr -d '=+/\n'; }
umask 077
mkdir -p "$env_dir"
key=$(secret)$(secret)
owner=$(secret); keygen=$(secret); keysync=$(secret); dispenser=$(secret); status=$(secret)
dsn() { echo "postgresql://$1:$2@postgres:5432/keydispenser"; }
cat > "$env_dir/postgres.env" <<ENV
POSTGRES_PASSWORD=$(secret)
KD_OWNER_PASSWORD=$owner
KD_KEYGEN_PASSWORD=$keygen
KD_KEYSYNC_PASSWORD=$keysync
KD_DISPENSER_PASSWORD=$dispenser
KD_STATUS_PASSWORD=$status
ENV
cat > "$env_dir/migrate.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_owner "$owner")
KD_PERMUTATION_KEY=$key
ENV
cat > "$env_dir/keygen.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_keygen "$keygen")
KD_PERMUTATION_KEY=$key
ENV
cat > "$env_dir/keysync.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_keysync "$keysync")
ENV
cat > "$env_dir/dispenser.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_dispenser "$dispenser")
ENV
cat > "$env_dir/status.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_status "$status")
KD_REDIS_URL=redis://redis:6379/0
ENV
echo "wrote $env_dir (mode 0600); back up the permutation key in $env_dir/keygen.env"
