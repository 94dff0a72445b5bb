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
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from shared.domain.errors import ConfigError

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


# sslmode values that verify the server's certificate against a CA.
_VERIFYING = frozenset({"verify-ca", "verify-full"})


def check_files(dsn: str) -> None:
    """ConfigError naming the option when a file the DSN needs is missing or unreadable:
    ``sslrootcert``, ``sslcert``, ``sslkey``, and the CA that ``sslmode=verify-ca`` or
    ``verify-full`` needs when no ``sslrootcert`` is given (libpq's and asyncpg's
    default, ``~/.postgresql/root.crt``, absent for a service user without a home).
    A missing file is a setup to fix, never an outage to retry."""
    query = dict(parse_qsl(urlsplit(dsn).query)) if "://" in dsn else {}
    for option, variable in (
        ("sslrootcert", "PGSSLROOTCERT"),
        ("sslcert", "PGSSLCERT"),
        ("sslkey", "PGSSLKEY"),
    ):
        path = query.get(option) or os.environ.get(variable)
        if path and not _readable(Path(path)):
            raise ConfigError(f"postgres_dsn: {option} {path} is not a readable file")
    mode = query.get("sslmode") or os.environ.get("PGSSLMODE", "")
    if mode in _VERIFYING and not (query.get("sslrootcert") or os.environ.get("PGSSLROOTCERT")):
        default = Path.home() / ".postgresql" / "root.crt"
        if not _readable(default):
            raise ConfigError(
                f"postgres_dsn: sslmode={mode} needs the CA that signed the server's "
                f"certificate, and {default} is not there: add "
                "sslrootcert=/path/to/ca.pem to the DSN"
            )


def _readable(path: Path) -> bool:
    try:
        return path.is_file() and os.access(path, os.R_OK)
    except OSError:
        return False


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
    check_files(dsn)
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
