"""dispenser: serves keys over HTTP from the hot tier (Starlette on uvicorn or granian)."""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from granian.server import Server as Granian
from starlette.types import ASGIApp

from dispenser.app import create_app
from dispenser.server import granian_options, uvicorn_options
from shared import logs
from shared.domain.config import Settings, load_settings
from shared.domain.errors import StoreUnavailable
from shared.stores.groups import Groups, HotRouter

log = logging.getLogger(__name__)
# Every worker builds its app from the same KD_CONFIG file and KD_ environment.
FACTORY = "dispenser.main:app_from_environment"


def app_from_environment() -> ASGIApp:
    settings = load_settings()
    logs.configure("dispenser", settings.log_level, settings.log_levels, settings.log_format)
    return create_app(settings)


async def refuse_evicting_redis(settings: Settings) -> None:
    """ConfigError on a hot-tier Redis that may evict; a warning when it cannot be
    reached yet (readiness checks again before the process counts as ready)."""
    hot = HotRouter.open(Groups(settings))  # every key group's server
    try:
        await hot.refuse_eviction()
        await hot.warn_if_reloadable()
    except StoreUnavailable as exc:
        log.warning("redis_unreachable_at_start", extra={"error": str(exc)})
    finally:
        await hot.close()


def main(settings: Settings) -> None:
    config = settings.dispenser
    asyncio.run(refuse_evicting_redis(settings))
    log.info(
        "dispenser_starting",
        extra={
            "host": config.host,
            "port": config.port,
            "workers": config.workers,
            "server": config.server,
        },
    )
    if config.server == "granian":
        run_granian(settings)
    else:
        run_uvicorn(settings)


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
