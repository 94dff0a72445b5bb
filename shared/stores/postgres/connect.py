"""Connecting to PostgreSQL when the DSN lists several hosts, each with its own deadline.

asyncpg tries the hosts of a multi-host DSN one after another under a single timeout
for the whole connect: a host that accepts TCP and never answers (a frozen or
partitioned old primary, a SIGSTOPped postmaster) listed first uses up that timeout,
and the primary listed after it is never tried. Here each host gets its own connect
timeout, and the next is tried when it passes; ``target_session_attrs`` is still
checked by asyncpg on each host.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

log = logging.getLogger(__name__)
# The time one host may take to accept a connection and answer its start-up.
CONNECT_TIMEOUT_S = 5.0
_HOST = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:]*))(?::(?P<port>\d*))?$")


def where(dsn: str) -> str:
    """A DSN without its scheme, credentials and options: host:port/database."""
    parts = urlsplit(dsn)
    return parts.netloc.rpartition("@")[2] + parts.path


def any_server(dsn: str) -> str:
    """``dsn`` without ``target_session_attrs``: a connection to whichever host is named,
    primary or standby (to ask it which it is)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "target_session_attrs"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def dsn_hosts(dsn: str) -> list[tuple[str, int | None]]:
    """The (host, port) pairs a URL DSN names in its authority (none for other forms,
    such as ``host=`` query parameters or a Unix socket: asyncpg handles those)."""
    if "://" not in dsn:
        return []
    netloc = urlsplit(dsn).netloc.rpartition("@")[2]
    hosts: list[tuple[str, int | None]] = []
    for part in netloc.split(","):
        found = _HOST.match(part)
        if found is None:
            return []
        host = found.group("v6") or found.group("host") or ""
        if not host:
            return []
        port = found.group("port")
        hosts.append((host, int(port) if port else None))
    return hosts


async def connect_each_host(
    dsn: str, *, host_timeout_s: float = CONNECT_TIMEOUT_S, **options: Any
) -> asyncpg.Connection:
    """``asyncpg.connect(dsn)``, giving each host of a multi-host DSN ``host_timeout_s``.

    ``options`` go to ``asyncpg.connect`` (the pool passes its own). Raises the last
    host's error when none could be used.
    """
    options.pop("loop", None)
    hosts = dsn_hosts(dsn)
    if len(hosts) <= 1:
        return await asyncpg.connect(dsn, timeout=host_timeout_s, **options)
    last: BaseException | None = None
    for host, port in hosts:
        try:
            return await asyncpg.connect(
                dsn, host=host, port=port, timeout=host_timeout_s, **options
            )
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            log.debug(
                "postgres_host_skipped", extra={"host": host, "port": port, "error": str(exc)}
            )
            last = exc
        except asyncpg.TargetServerAttributeNotMatched as exc:  # a standby: try the next
            last = exc
    assert last is not None
    raise last
