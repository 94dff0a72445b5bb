"""dispenser: serves keys over HTTP from the hot tier (Starlette on uvicorn or granian)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import uvicorn
from granian.server import Server as Granian
from starlette.types import ASGIApp

from dispenser.app import create_app
from dispenser.server import granian_options, uvicorn_options
from dispenser.worker_metrics import ENV
from shared import logs
from shared.domain.config import Settings, load_settings
from shared.domain.errors import ConfigError, StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.stores.fence.sql import SELECT_LEDGER_STATE
from shared.stores.groups import refuse_evicting_redis
from shared.stores.postgres.cold_store import ColdStore, checked_pooling, translated

log = logging.getLogger(__name__)
# Every worker builds its app from the same KD_CONFIG file and KD_ environment.
FACTORY = "dispenser.main:app_from_environment"


def app_from_environment() -> ASGIApp:
    settings = load_settings()
    logs.configure("dispenser", settings.log_level, settings.log_levels, settings.log_format)
    return create_app(settings)


async def refuse_unusable_postgres(settings: Settings) -> None:
    """When a type keeps a ledger (lookups read PostgreSQL): ConfigError on a PostgreSQL
    this process cannot use as configured (a wrong password, a missing database or
    privilege, a missing CA file, a bad DSN option), naming ``postgres_dsn``; a warning
    when it cannot be reached yet (lookups answer 503 IDG-005 until it can)."""
    if not any(t.config.ledger for t in build_id_types(settings, generating=False).values()):
        return
    try:
        store = await ColdStore.for_settings(settings, min_size=1, max_size=1)
        try:
            await checked_pooling(settings)
            async with store.connection() as conn, translated("start-up check"):
                await conn.fetchrow(SELECT_LEDGER_STATE)
        finally:
            await store.close()
    except StoreUnavailable as exc:
        log.warning("postgres_unreachable_at_start", extra={"error": str(exc)})
    except ConfigError as exc:
        raise ConfigError(f"postgres_dsn: the dispenser cannot read the ledger: {exc}") from exc


def main(settings: Settings) -> None:
    config = settings.dispenser
    asyncio.run(refuse_evicting_redis(settings))
    asyncio.run(refuse_unusable_postgres(settings))
    log.info(
        "dispenser_starting",
        extra={
            "host": config.host,
            "port": config.port,
            "workers": config.workers,
            "server": config.server,
        },
    )
    with worker_metrics_directory(config.workers):
        if config.server == "granian":
            run_granian(settings)
        else:
            run_uvicorn(settings)


@contextlib.contextmanager
def worker_metrics_directory(workers: int) -> Iterator[None]:
    """With several workers, a directory for their metrics (dispenser/worker_metrics.py),
    named to them in the environment they inherit; gone when the supervisor stops."""
    if workers == 1:
        yield
        return
    directory = tempfile.mkdtemp(prefix="kd-worker-metrics-")
    os.environ[ENV] = directory
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(directory, ignore_errors=True)


def run_uvicorn(settings: Settings) -> None:
    options = uvicorn_options(settings.dispenser)
    if settings.dispenser.workers == 1:
        uvicorn.Server(uvicorn.Config(create_app(settings), **options)).run()
    else:
        # Worker processes import the factory; they share the listening socket.
        uvicorn.run(FACTORY, factory=True, **options, workers=settings.dispenser.workers)


def run_granian(settings: Settings) -> None:
    """granian always serves from worker processes (one or more) under this one, which
    only supervises them; each worker imports the factory and runs the app's lifespan."""
    options = granian_options(settings.dispenser, settings.log_level)
    Granian(FACTORY, factory=True, **options).serve()
