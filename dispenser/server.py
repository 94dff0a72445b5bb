"""uvicorn, configured with the limits a server exposed to clients needs.

uvicorn offers a concurrency limit, a keep-alive timeout and (for its h11 parser only)
a bound on the request head. Its faster httptools parser keeps no bound: a client can
send megabytes of headers and they are held in memory. ``BoundedHttpTools`` adds the
same bound to it. Slow clients (a request sent a byte at a time) are the reverse
proxy's to cut off: see deploy/nginx.conf and docs/security.md.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.domain.settings import DispenserConfig

HEAD_TOO_LARGE = "Request head too large."


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
        "timeout_graceful_shutdown": 10,
    }
