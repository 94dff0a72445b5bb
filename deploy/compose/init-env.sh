#!/bin/sh
# Writes deploy/compose/env/: one env file per service, each with only what that service
# needs (a password per PostgreSQL role and per Redis user, the permutation key for
# migrate and keygen alone), and redis-users.acl: deploy/redis/users.acl (a Redis ACL
# user per process, `keydispenser redis-acl`) with each user's password as its SHA-256.
# Run once; it refuses to overwrite an existing env/ (the permutation key in it defines
# the keyspace: back it up where your other secrets live).
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
# Redis: a user per process (its name kd-<process>, the default namespace's).
r_keygen=$(secret); r_keysync=$(secret); r_dispenser=$(secret); r_status=$(secret)
redis_url() { echo "redis://kd-$1:$2@redis:6379/0"; }
hashed() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
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
KD_REDIS_URL=$(redis_url keygen "$r_keygen")
KD_PERMUTATION_KEY=$key
ENV
cat > "$env_dir/keysync.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_keysync "$keysync")
KD_REDIS_URL=$(redis_url keysync "$r_keysync")
ENV
cat > "$env_dir/dispenser.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_dispenser "$dispenser")
KD_REDIS_URL=$(redis_url dispenser "$r_dispenser")
ENV
cat > "$env_dir/status.env" <<ENV
KD_POSTGRES_DSN=$(dsn kd_status "$status")
KD_REDIS_URL=$(redis_url status "$r_status")
ENV
# The Redis server reads this one (its user, in its container): hashes only, 0644. The
# default user may only PING (the health check); the users not given a password here
# (admin, lease, Sentinel's, the replicas') cannot log in.
acl="$env_dir/redis-users.acl"
sed -e "s/^user kd-keygen on resetpass /&#$(hashed "$r_keygen") /" \
    -e "s/^user kd-keysync on resetpass /&#$(hashed "$r_keysync") /" \
    -e "s/^user kd-dispenser on resetpass /&#$(hashed "$r_dispenser") /" \
    -e "s/^user kd-status on resetpass /&#$(hashed "$r_status") /" \
    "$here/../redis/users.acl" > "$acl"
echo "user default on nopass resetkeys resetchannels -@all +ping" >> "$acl"
chmod 0644 "$acl"
echo "wrote $env_dir (mode 0600); back up the permutation key in $env_dir/keygen.env"
