"""dispenser: serves keys over HTTP from the hot tier (uvicorn + Starlette)."""

from __future__ import annotations

import logging

import uvicorn
from starlette.types import ASGIApp

from dispenser.app import create_app
from shared import logs
from shared.domain.settings import Settings, load_settings

log = logging.getLogger(__name__)
# Every worker builds its app from the same KD_CONFIG file and KD_ environment.
FACTORY = "dispenser.main:app_from_environment"


def app_from_environment() -> ASGIApp:
    settings = load_settings()
    logs.configure("dispenser", settings.log_level)
    return create_app(settings)


def main(settings: Settings) -> None:
    workers = settings.dispenser.workers
    options = {
        "host": settings.dispenser.host,
        "port": settings.dispenser.port,
        "log_config": None,
        "access_log": False,
        "lifespan": "on",
        "timeout_graceful_shutdown": 10,
    }
    log.info(
        "dispenser_starting",
        extra={
            "host": settings.dispenser.host,
            "port": settings.dispenser.port,
            "workers": workers,
        },
    )
    if workers == 1:
        uvicorn.Server(uvicorn.Config(create_app(settings), **options)).run()  # type: ignore[arg-type]
    else:
        # Worker processes import the factory; they share the listening socket.
        uvicorn.run(FACTORY, factory=True, workers=workers, **options)  # type: ignore[arg-type]
