"""What each process's PostgreSQL role may do: granted by ``migrate`` (as the owner of
every object), on every object the schema holds, and nothing more
(docs/security.md, "PostgreSQL roles").

deploy/postgres/roles.sql creates the roles (``<prefix>_keygen``, ``<prefix>_keysync``,
``<prefix>_dispenser``, ``<prefix>_status``; the prefix is ``postgres_role_prefix``, so
two environments on one server have roles of their own) and lets them connect and use
the schema; migrate grants each its tables, sequences and functions by this table, and
revokes whatever else any of them held. A role that does not exist is skipped (a
development database migrated and used by one superuser).

Who writes what, and why:

- keygen leases ranges (``kd_ranges``, the type's sequence, the sync clock), copies keys
  into the cold tier (INSERT only: it never reads a key back; it counts them through
  ``kd_cold_depth``) and may fence (DELETE on cold tables, setval, the fence's event
  and clock). It never touches the ledger, the types, the retired names, the schema
  version or a binding it did not make (INSERT only: bound once).
- keysync takes batches (DELETE ... RETURNING on cold tables: it must read what it
  pushes), puts released keys back (INSERT), is the ledger's only writer (every ledger
  table, released issues, early marks, the chain, the outcomes), and may fence.
- the dispenser reads the ledger (lookups, MOSIP's statuses) and the sync clock (a
  lookup is judged against the fence's record): never a cold table or a range.
- keygen and keysync read the IDs an import excluded (``kd_excluded``: never
  generated, never put back) and the import epochs (``kd_import_epochs``: keysync's
  batches carry them; keygen's headroom counts the excluded again when one moved).
- status reads everything but the keys still to be handed out: it counts them through
  ``kd_cold_depth``.
- Nothing but the owner (migrate, retire, fence-postgres) creates, alters, truncates
  or drops anything, or changes a type, a retired name, the schema version or the
  binding.
"""

from __future__ import annotations

from typing import Final

import asyncpg

from shared.stores.postgres import sql

PROCESSES: Final = ("keygen", "keysync", "dispenser", "status")

_READ = "SELECT"
# Tables every database holds: role -> privileges.
TABLES: Final[dict[str, dict[str, str]]] = {
    "kd_sync_clock": {
        "keygen": "SELECT, UPDATE",
        "keysync": "SELECT, UPDATE",
        "dispenser": _READ,
        "status": _READ,
    },
    "kd_fence_events": {"keygen": "INSERT", "keysync": "INSERT", "status": _READ},
    "kd_ranges": {"keygen": "SELECT, INSERT, UPDATE", "keysync": _READ, "status": _READ},
    "kd_id_types": {"keygen": _READ, "keysync": _READ, "status": _READ},
    "kd_schema_version": {"keygen": _READ, "keysync": _READ, "dispenser": _READ, "status": _READ},
    "kd_retired_types": {"status": _READ},
    "kd_binding": {"keygen": "SELECT, INSERT", "keysync": "SELECT, INSERT", "status": _READ},
    "kd_released_issues": {
        "keysync": "SELECT, INSERT, UPDATE",
        "dispenser": _READ,
        "status": _READ,
    },
    "kd_ledger_early_marks": {"keysync": "SELECT, INSERT, DELETE", "status": _READ},
    "kd_chain_links": {"keygen": _READ, "keysync": "SELECT, INSERT, DELETE", "status": _READ},
    "kd_outcomes": {"keysync": "SELECT, INSERT, UPDATE, DELETE", "status": _READ},
    "kd_quarantined_keys": {"keysync": "SELECT, INSERT", "dispenser": _READ, "status": _READ},
    "kd_excluded": {"keygen": _READ, "keysync": _READ, "status": _READ},
    "kd_import_epochs": {"keygen": _READ, "keysync": _READ, "status": _READ},
}
SEQUENCES: Final[dict[str, dict[str, str]]] = {
    "kd_fence_events_id_seq": {"keygen": "USAGE", "keysync": "USAGE"},
}
FUNCTIONS: Final[dict[str, dict[str, str]]] = {
    "kd_cold_depth(text, bigint)": {"keygen": "EXECUTE", "status": "EXECUTE"},
}
# Each type's own objects.
COLD: Final = {"keygen": "INSERT, DELETE", "keysync": "SELECT, INSERT, DELETE"}
SEQUENCE: Final = {"keygen": "USAGE, SELECT, UPDATE", "keysync": "SELECT, UPDATE", "status": _READ}
LEDGER: Final = {"keysync": "SELECT, INSERT, UPDATE, DELETE", "dispenser": _READ, "status": _READ}

# No parameters. The types the database holds (their objects get grants).
SELECT_TYPES: Final = "SELECT name FROM kd_id_types ORDER BY name"
# $1: role names. Those that exist.
SELECT_ROLES: Final = "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])"
# $1: relation name. Whether it exists.
SELECT_RELATION: Final = "SELECT to_regclass($1) IS NOT NULL"


def role_names(prefix: str) -> dict[str, str]:
    """process -> its role's name."""
    return {process: f"{prefix}_{process}" for process in PROCESSES}


async def apply_grants(conn: asyncpg.Connection, prefix: str) -> list[str]:
    """Grant each existing process role exactly its privileges on every object (in the
    caller's transaction); the roles granted."""
    names = role_names(prefix)
    found = {r["rolname"] for r in await conn.fetch(SELECT_ROLES, list(names.values()))}
    roles = {process: name for process, name in names.items() if name in found}
    if not roles:
        return []
    objects = await _objects(conn)
    for kind, name, grants in objects:
        for process, role in roles.items():
            target = f"{kind} {name}"
            await conn.execute(f"REVOKE ALL ON {target} FROM {sql.ident(role)}")
            if process in grants:
                await conn.execute(f"GRANT {grants[process]} ON {target} TO {sql.ident(role)}")
    return sorted(roles.values())


async def _objects(conn: asyncpg.Connection) -> list[tuple[str, str, dict[str, str]]]:
    """(kind, quoted name, role grants) of every object the schema holds."""
    found: list[tuple[str, str, dict[str, str]]] = []
    for table, grants in TABLES.items():
        if await conn.fetchval(SELECT_RELATION, table):
            found.append(("TABLE", sql.ident(table), grants))
    for sequence, grants in SEQUENCES.items():
        if await conn.fetchval(SELECT_RELATION, sequence):
            found.append(("SEQUENCE", sql.ident(sequence), grants))
    for function, grants in FUNCTIONS.items():
        found.append(("FUNCTION", function, grants))
    for row in await conn.fetch(SELECT_TYPES):
        name = str(row["name"])
        per_type = (
            ("TABLE", sql.cold_table(name), COLD),
            ("SEQUENCE", sql.sequence(name), SEQUENCE),
            ("TABLE", sql.ledger_table(name), LEDGER),
        )
        for kind, quoted, grants in per_type:
            if await conn.fetchval(SELECT_RELATION, quoted):
                found.append((kind, quoted, grants))
    return found
