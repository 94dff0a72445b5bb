"""``keydispenser retire``: remove what a type left behind once it left the configuration."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import asyncpg

from shared.domain.config import Settings, path_segments
from shared.domain.errors import ConfigError
from shared.domain.names import ID_TYPE_NAME
from shared.stores.groups import Groups
from shared.stores.hot.hot_store import HotStore
from shared.stores.postgres import schema
from shared.stores.postgres.connect import check_files, driver_options


def refuse_configured(settings: Settings, name: str) -> None:
    """A type still configured (by name or alias) is never retired."""
    owner = path_segments(settings.id_types).get(name)
    if owner is not None:
        raise ConfigError(
            f"id_types.{owner}: '{name}' is still configured: remove the type from the "
            "configuration and roll every process before retiring it"
        )
    if not ID_TYPE_NAME.fullmatch(name):
        raise ConfigError(f"--type: '{name}' is not an id type name ({ID_TYPE_NAME.pattern})")


async def retire(settings: Settings, name: str, *, drop_ledger: bool) -> dict[str, Any]:
    """PostgreSQL first (the tombstone), then Redis; both idempotent, so a retire that
    stopped half-way is finished by running it again."""
    refuse_configured(settings, name)
    check_files(settings.postgres_dsn)
    conn = await asyncpg.connect(settings.postgres_dsn, **driver_options(settings.postgres_pooler))
    try:
        done = await schema.retire(conn, name, drop_ledger=drop_ledger)
    finally:
        await conn.close()
    groups = Groups(settings)
    try:  # where its keys lived: its own key group with a cluster's slot_per: type
        dropped = await HotStore(*groups.place(name)).forget(name)
    finally:
        await groups.close()
    return asdict(done) | {"hot_keys_dropped": dropped}
