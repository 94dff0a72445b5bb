"""A connection whose statement was interrupted is discarded, never given back to be
reused (``cold_store.INTERRUPTIONS``).

asyncpg's pool, given back a connection whose statement its caller cancelled (a deadline
of ours: keygen's COPY, /readyz's probe), first waits for the server to acknowledge the
cancellation: across a cut link (or on a frozen server) until the statement's own
deadline passes (30 s), the caller with it, long after its deadline said the statement
failed (a 1 s readiness probe answered after 30). Given back one whose server ended the
session mid-transaction (a switchover's fast shutdown), it tries to roll back through a
protocol stuck on the server's last message ("cannot switch to state 15; another
operation (2) is in progress"). Discarded instead, the next statement gets a fresh
connection.

The link to PostgreSQL goes through the drill's proxy, cut while a statement runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import pytest

from keydispenser_ops.drill.proxy import Proxy, standalone
from keydispenser_ops.pgbouncer import through
from shared.domain.config import Settings
from shared.stores.ledger.reader import LedgerReader
from shared.stores.postgres.cold_store import ColdStore
from tests.integration.fixtures import Servers

DEADLINE_S = 1.0  # the statements' deadline here
WAIT_S = 10.0  # far past it, far below the statements' own deadline (30 s)


@pytest.fixture
def link(servers: Servers) -> Iterator[Proxy]:
    target = urlsplit(servers.postgres_admin_dsn)
    proxy = standalone(target.hostname or "127.0.0.1", target.port or 5432)
    try:
        yield proxy
    finally:
        proxy.hub.close()


@pytest.fixture
async def cut_off(
    servers: Servers, database: str, settings: Settings, link: Proxy
) -> AsyncIterator[ColdStore]:
    """A store of one connection through ``link``, with the default deadlines (30 s a
    statement: what giving back an interrupted connection waited, on a cut link)."""
    dsn = through(servers.direct_dsn_for(database), link.port)
    cold = await ColdStore.connect(dsn, min_size=1, max_size=1)
    try:
        yield cold
    finally:
        link.set("pass")
        await asyncio.wait_for(cold.close(), WAIT_S)


async def test_a_block_its_caller_gave_up_on_leaves_no_connection_waiting(
    cut_off: ColdStore, link: Proxy
) -> None:
    """A block of statements (a ledger transaction, a COPY) cancelled by its caller's
    deadline on a cut link: the caller goes on at once, the connection is discarded
    rather than given back to wait for the server's word on the cancellation, and the
    next block, once the link is back, is served."""

    async def block() -> int:
        async with cut_off.connection() as conn, conn.transaction():
            return int(await conn.fetchval("SELECT count(*) FROM kd_ranges"))

    assert await block() == 0
    link.set("cut")
    async with asyncio.timeout(WAIT_S) as waited:
        with pytest.raises(TimeoutError):  # the caller's deadline
            await asyncio.wait_for(block(), DEADLINE_S)
    assert not waited.expired(), "giving the connection back waited on the cut link"
    link.set("pass")
    assert await asyncio.wait_for(block(), WAIT_S) == 0


async def test_a_readiness_probe_cut_off_answers_within_its_timeout(
    servers: Servers, database: str, link: Proxy
) -> None:
    """/readyz's probe gives up after its timeout and a later one is answered: the
    connection it was cut off on is not waited for."""
    reader = LedgerReader(through(servers.direct_dsn_for(database), link.port))
    try:
        assert await reader.probe() is None
        link.set("cut")
        assert await asyncio.wait_for(reader.probe(timeout_s=DEADLINE_S), WAIT_S) == "unreachable"
        link.set("pass")
        assert await asyncio.wait_for(reader.probe(), WAIT_S) is None
    finally:
        link.set("pass")
        await asyncio.wait_for(reader.close(), WAIT_S)
