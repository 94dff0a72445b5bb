"""Structured logs: one line per event, a stable event name plus fields.

JSON objects by default (``log_format: json``, what production collects); a readable
line per event on a terminal (``log_format: console``, what ``keydispenser up`` uses
there): ``12:00:01 keysync  warning  batch_lost  id_type=farmer keys=5000``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

# A record's own attributes, and uvicorn's ``color_message`` (its message again, with
# ANSI colour codes): never fields of an event.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "color_message",
}


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


class ConsoleFormatter(logging.Formatter):
    """One readable line per event, for people at a terminal."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{key}={_short(value)}"
            for key, value in record.__dict__.items()
            if key not in _RESERVED
        )
        line = (
            f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
            f"{self._process:<9} {record.levelname.lower():<8} {record.getMessage()}"
        )
        line = f"{line}  {fields}" if fields else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


FORMATTERS: dict[str, type[logging.Formatter]] = {
    "json": JsonFormatter,
    "console": ConsoleFormatter,
}


def configure(
    process: str,
    level: str = "INFO",
    levels: Mapping[str, str] | None = None,
    log_format: str = "json",
) -> None:
    """Lines on stderr at ``level``, as ``log_format`` (json, console) says; ``levels``:
    loggers (and the loggers below them) at levels of their own, set last."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATTERS[log_format](process))
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
