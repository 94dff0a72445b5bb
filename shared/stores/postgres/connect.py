"""Connecting to PostgreSQL: directly or through a pooler, each host of a multi-host DSN
with its own deadline.

How a connection talks depends on what stands between it and PostgreSQL
(``postgres_pooler``, ``driver_options``); a pooler that lends a server per transaction
where the setting says otherwise is refused at start (``refuse_unsaid_pooling``).

asyncpg tries the hosts of a multi-host DSN one after another under a single timeout
for the whole connect: a host that accepts TCP and never answers (a frozen or
partitioned old primary, a SIGSTOPped postmaster) listed first uses up that timeout,
and the primary listed after it is never tried. Here each host gets its own connect
timeout, and the next is tried when it passes; ``target_session_attrs`` is still
checked by asyncpg on each host.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg

from shared.domain.errors import ConfigError
from shared.stores.postgres import sql

log = logging.getLogger(__name__)
# The time one host may take to accept a connection and answer its start-up.
CONNECT_TIMEOUT_S = 5.0
# Every statement is planned for the arrays it is given and the tables as they are now.
# asyncpg prepares each statement once per connection, and after five runs PostgreSQL
# may keep a generic plan: one made while a ledger table was still empty (a fresh
# type, never analyzed yet) joined a batch's unnest() by scanning the whole table for
# every mark, and kept doing so as the table grew (500 marks on 100,000 rows: 22 s
# instead of 5 ms, test_plans.py). The statements here move batches, so planning each
# run costs little beside them.
SERVER_SETTINGS: Final = {"plan_cache_mode": "force_custom_plan"}
# How long the pooling probe waits for its first connection's second answer while the
# second holds a transaction (a pool of one server connection makes it wait: undecided).
PROBE_WAIT_S = 2.0


def driver_options(pooler: str) -> dict[str, Any]:
    """asyncpg's options for connections that reach PostgreSQL the way ``pooler`` (the
    ``postgres_pooler`` setting) says.

    Directly: ``SERVER_SETTINGS`` as startup parameters, and each statement prepared
    once per connection (named, cached). Through a pooler, neither: PgBouncer refuses
    a startup parameter it does not know, and a pooler in transaction mode lends each
    transaction whichever server connection is free, where a statement prepared on
    another is not found (``prepared statement "__asyncpg_stmt_N__" does not exist``).
    Without a cache asyncpg sends unnamed statements, parsed again with every run in
    the same exchange as the run itself, so nothing outlives a transaction; each is
    planned for its arguments, which is what ``SERVER_SETTINGS`` asks for.
    """
    if pooler == "none":
        return {"server_settings": dict(SERVER_SETTINGS)}
    return {"statement_cache_size": 0}


def pooled_per_transaction_error(pooler: str, detail: str = "") -> ConfigError:
    """The refusal of a process whose connections are lent a server per transaction
    while ``postgres_pooler`` says otherwise."""
    seen = f" ({detail})" if detail else ""
    said = f"postgres_pooler is '{pooler}'" if pooler else "postgres_pooler does not say so"
    return ConfigError(
        f"postgres_pooler: connections to postgres_dsn are pooled per transaction{seen} "
        f"(PgBouncer's pool_mode = transaction), and {said}: set "
        'postgres_pooler: transaction (docs/operations.md, "PgBouncer")'
    )


async def pooled_per_transaction(dsn: str, host_timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether ``dsn``'s connections are lent a server per transaction.

    One connection asks which server process answers it, then asks again while a
    second connection holds a transaction open: a transaction pooler lends the server
    the first one just gave back to the second (PgBouncer takes the server used last),
    so the first is answered by another. Directly, or through a pooler in session
    mode, a connection keeps its server. False when it cannot tell (a pool of one
    server connection keeps the first waiting until the transaction ends).
    """
    options = driver_options("transaction")  # understood by every pooler
    first = await connect_each_host(dsn, host_timeout_s=host_timeout_s, **options)
    try:
        second = await connect_each_host(dsn, host_timeout_s=host_timeout_s, **options)
        try:
            before = await first.fetchval(sql.SELECT_BACKEND_PID)
            async with second.transaction():
                await second.fetchval(sql.SELECT_BACKEND_PID)
                try:
                    asked = first.fetchval(sql.SELECT_BACKEND_PID)
                    after = await asyncio.wait_for(asked, PROBE_WAIT_S)
                except TimeoutError:
                    return False
        finally:
            second.terminate()
    finally:
        first.terminate()
    return bool(before != after)


async def refuse_unsaid_pooling(
    dsn: str, pooler: str, host_timeout_s: float = CONNECT_TIMEOUT_S
) -> None:
    """ConfigError naming ``postgres_pooler`` when ``dsn``'s connections are pooled per
    transaction and the setting does not say so: named statements would fail within
    seconds, and keygen's LISTEN would hear nothing. Driver errors are raised as they
    come (the caller translates them)."""
    if pooler != "transaction" and await pooled_per_transaction(dsn, host_timeout_s):
        raise pooled_per_transaction_error(pooler, "one connection was answered by two servers")


_HOST = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:]*))(?::(?P<port>\d*))?$")


def where(dsn: str) -> str:
    """A DSN without its scheme, credentials and options: host:port/database."""
    parts = urlsplit(dsn)
    return parts.netloc.rpartition("@")[2] + parts.path


def user_of(dsn: str) -> str:
    """The user a DSN logs in as (empty when it names none)."""
    return unquote(urlsplit(dsn).username or "") if "://" in dsn else ""


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
