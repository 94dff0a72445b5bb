"""``keydispenser fill``: pre-fill the cold inventory of one type, with a progress bar.

Uses the same range leasing as keygen, so it is safe while keygen processes run.
It stops at the end of the range that reaches the count (a range is never left
half-generated on purpose).
"""

from __future__ import annotations

import asyncio
import logging

from tqdm import tqdm

from keygen.generation import Generator
from keygen.main import Keygen
from shared.domain.config import Settings
from shared.domain.errors import ConfigError, KeyspaceExhausted
from shared.domain.idtypes import build_id_types
from shared.runtime import stop_on_signals
from shared.stores.fence.binding import bind
from shared.stores.groups import SyncRecords
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.schema import check

log = logging.getLogger(__name__)


async def fill(settings: Settings, name: str, count: int) -> int:
    types = build_id_types(settings)
    if name in settings.id_types and name not in types:
        raise ConfigError(f"--type: '{name}' is a snowflake type: its IDs are minted, not filled")
    if name not in types:
        raise ConfigError(f"--type: unknown id type '{name}' (known: {', '.join(sorted(types))})")
    stop = stop_on_signals()
    cold = await ColdStore.for_settings(settings)
    sync = SyncRecords.from_settings(settings) if settings.postgres_fence else None
    generator = Generator(settings.keygen.threads)
    added = 0
    try:
        async with cold.connection() as conn:
            await check(conn, types)
        await bind(cold, sync, settings.redis_namespace)
        keygen = Keygen.on_postgres(settings, cold, sync, stop, generator)
        with tqdm(total=count, unit="keys", unit_scale=True, desc=name) as bar:
            while added < count and not stop.is_set():
                added += await keygen.lease_and_generate(types[name], bar.update)
                if keygen.exhausted(name):
                    raise KeyspaceExhausted(name)
    finally:
        generator.close()
        await cold.close()
        if sync is not None:
            await sync.close()
        log.info("fill_done", extra={"id_type": name, "added": added})
    return added


def main(settings: Settings, name: str, count: int) -> None:
    added = asyncio.run(fill(settings, name, count))
    print(f"added {added} keys of type {name}")
