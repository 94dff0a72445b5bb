"""One Redis namespace, one PostgreSQL database (invariant one-namespace-one-database).

An operator who points two environments at one Redis namespace (or one database at
two namespaces) would have each environment's stamps judge the other's PostgreSQL: the
fences would take turns discarding inventory, and two stacks sharing a permutation key
would push the same keys. So the pairing is bound on first use, on both sides: the
database records its namespace (``kd_binding``), the namespace's sync record its
database (``database``: system identifier and database name, which every physical
replica shares). Every process that writes either (keygen, keysync, fill, the
operator's fence) checks both at start-up and refuses a second pairing, naming both;
afterwards every stamp carries its database, and the record refuses another's.
"""

from __future__ import annotations

import logging

from shared.domain.errors import NamespaceBound, StoreUnavailable
from shared.stores.fence import sql as fence_sql
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.groups import SyncRecords, records_of
from shared.stores.postgres.cold_store import ColdStore, translated

log = logging.getLogger(__name__)


async def bind(cold: ColdStore, sync: SyncRecord | SyncRecords | None, namespace: str) -> str:
    """Bind (first use) or check the pairing; returns this database's identity.

    NamespaceBound (a configuration error: the process exits) when either side is
    bound to something else (``sync``: every key group's record). ``sync`` None (the
    PostgreSQL fence switched off, a drill's control case) checks the database's side
    only.
    """
    async with cold.connection() as conn, translated("bind"):
        database = str(await conn.fetchval(fence_sql.SELECT_DATABASE_IDENTITY))
        bound = await conn.fetchval(fence_sql.BIND_NAMESPACE, namespace)
        if bound is None:  # another process bound it concurrently: read it now
            bound = await conn.fetchval(fence_sql.BIND_NAMESPACE, namespace)
    if bound != namespace:
        raise NamespaceBound(
            f"redis_namespace: database {database} is bound to redis_namespace '{bound}', "
            f"and this process brings '{namespace}' (one namespace, one database: set "
            f"redis_namespace to '{bound}', or point postgres_dsn at this environment's "
            "own database)"
        )
    records = records_of(sync) if sync is not None else None
    for record in records or ():
        try:
            holder = await record.bind(database)  # every key group's record
        except StoreUnavailable:
            if records is None or not records.several:
                raise
            # Its shard is down: not to hold every type's start-up for it. The record
            # is bound by its group's first guarded statement instead (a record never
            # written must be vouched for first, and a vouch binds it).
            log.warning("namespace_bind_deferred", extra={"key_namespace": record.namespace})
            continue
        if holder != database:
            raise NamespaceBound.elsewhere(namespace, holder, database)
    log.info("namespace_bound", extra={"redis_namespace": namespace, "database": database})
    return database
