"""dispenser: serves keys over HTTP from the hot tier (uvicorn + Starlette)."""

from __future__ import annotations

import logging

import uvicorn

from dispenser.app import create_app
from shared.settings import Settings

log = logging.getLogger(__name__)


def main(settings: Settings) -> None:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.dispenser.host,
        port=settings.dispenser.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    log.info(
        "dispenser_starting",
        extra={"host": settings.dispenser.host, "port": settings.dispenser.port},
    )
    uvicorn.Server(config).run()
