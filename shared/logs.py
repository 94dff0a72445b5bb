"""Structured JSON logs: one object per line, a stable event name plus fields."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "process": self._process,
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED:
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure(process: str, level: str = "INFO", levels: Mapping[str, str] | None = None) -> None:
    """JSON lines on stderr at ``level``; ``levels``: loggers (and the loggers below
    them) at levels of their own, set last."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("uvicorn.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # While PostgreSQL is down the pool logs a traceback per reconnection attempt; the
    # stores already log one store_unavailable line per outage.
    logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
    for name, own in (levels or {}).items():
        logging.getLogger(name).setLevel(own)
