"""The HTTP servers (uvicorn, granian), configured with the limits a server exposed to
clients needs. ``dispenser.server`` picks one; both run the same app: uvicorn as ASGI,
granian over its native RSGI (``dispenser.rsgi``).

uvicorn offers a concurrency limit, a keep-alive timeout and (for its h11 parser only)
a bound on the request head. Its faster httptools parser keeps no bound: a client can
send megabytes of headers and they are held in memory. ``BoundedHttpTools`` adds the
same bound to it. Slow clients (a request sent a byte at a time) are the reverse
proxy's to cut off: see deploy/nginx.conf and docs/security.md.

granian (a Rust HTTP server, hyper underneath) offers the same bounds in its own terms:
hyper's read buffer bounds the request head (431 past it, never below 8192 bytes),
``header_read_timeout`` closes a connection that has not sent a whole request head in
time (idle keep-alive connections included, so it is the keep-alive timeout too, and a
slow-head timeout uvicorn lacks), ``backpressure`` caps the connections a worker serves
at once (more wait in the listen backlog instead of getting 503), and a worker asked to
stop finishes the requests it holds before the app's shutdown runs, within
``workers_kill_timeout``.
"""

from __future__ import annotations

from typing import Any

from granian.constants import HTTPModes, Interfaces, Loops
from granian.http import HTTP1Settings
from granian.log import LogLevels
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.domain.config import DispenserConfig

HEAD_TOO_LARGE = "Request head too large."
# Seconds a stopping server gives in-flight requests before it cuts them off.
GRACEFUL_SHUTDOWN_S = 10
# hyper refuses a read buffer smaller than this (its bound on the request head).
GRANIAN_MIN_HEAD_BYTES = 8_192


class BoundedHttpTools(HttpToolsProtocol):
    """httptools with a bound on the request head (request line and headers).

    The bound is uvicorn's ``h11_max_incomplete_event_size`` (what h11 enforces), so
    both parsers keep one. Bytes are counted per chunk received while a head is
    incomplete: the bound is exceeded by at most one read before the connection is
    answered 400 and closed.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_head_bytes: int = self.config.h11_max_incomplete_event_size or 16_384
        self._head_bytes = 0
        self._in_body = False
        self._heads = 0

    def data_received(self, data: bytes) -> None:
        in_head, heads = not self._in_body, self._heads
        super().data_received(data)
        if self._heads != heads:  # a head completed in this chunk
            self._head_bytes = 0
        elif in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self.logger.warning(HEAD_TOO_LARGE)
                self.send_400_response(HEAD_TOO_LARGE)

    def on_headers_complete(self) -> None:
        self._heads += 1
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()


def uvicorn_options(config: DispenserConfig) -> dict[str, Any]:
    """The uvicorn settings every dispenser server runs with (host and port included)."""
    return {
        "host": config.host,
        "port": config.port,
        "http": BoundedHttpTools,
        "h11_max_incomplete_event_size": config.max_header_bytes,
        "limit_concurrency": config.limit_concurrency,
        "timeout_keep_alive": config.timeout_keep_alive_s,
        "log_config": None,
        "access_log": False,
        "lifespan": "on",
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
    }


def granian_head_bytes(config: DispenserConfig) -> int:
    """granian's bound on the request head: ``max_header_bytes``, at least hyper's minimum."""
    return max(config.max_header_bytes, GRANIAN_MIN_HEAD_BYTES)


def granian_options(config: DispenserConfig, log_level: str = "INFO") -> dict[str, Any]:
    """The granian settings every dispenser server runs with (host and port included),
    as keyword arguments of ``granian.server.Server`` (the target excepted)."""
    return {
        "address": config.host,
        "port": config.port,
        # granian's native interface; the app runs its ASGI lifespan in every worker.
        "interface": Interfaces.RSGI,
        "workers": config.workers,
        "loop": Loops.uvloop,
        "http": HTTPModes.http1,
        "websockets": False,
        # Connections per worker; None leaves granian's default (1024 / workers).
        "backpressure": config.limit_concurrency,
        "http1_settings": HTTP1Settings(
            header_read_timeout=config.timeout_keep_alive_s * 1_000,
            keep_alive=True,
            max_buffer_size=granian_head_bytes(config),
        ),
        "log_level": LogLevels(log_level.lower()),
        # granian's own lines go to the root logger (the process's JSON output).
        "log_dictconfig": {"loggers": {"_granian": {"handlers": [], "propagate": True}}},
        "log_access": False,
        "workers_kill_timeout": GRACEFUL_SHUTDOWN_S,
    }
