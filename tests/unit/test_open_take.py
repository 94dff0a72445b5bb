"""How a take's (and a keygen insert's) transaction ends: its commit or rollback decides
the outcome; giving the connection back afterwards cannot (the pool closes a connection
whose reset failed)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import asyncpg
import pytest

from shared.domain.config import IdTypeConfig
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import IdType
from shared.domain.tiers import LeasedRange, Stamp
from shared.stores.postgres.cold_store import ColdStore, OpenTake


class Transaction:
    def __init__(self, commit_error: BaseException | None = None) -> None:
        self.commit_error = commit_error
        self.ended: list[str] = []

    async def commit(self) -> None:
        if self.commit_error is not None:
            raise self.commit_error
        self.ended.append("commit")

    async def rollback(self) -> None:
        self.ended.append("rollback")


class Pool:
    """A pool whose release fails as asyncpg's does when the connection's reset fails."""

    def __init__(self, release_error: BaseException | None) -> None:
        self.release_error = release_error
        self.released: list[Any] = []

    async def release(self, conn: Any) -> None:
        self.released.append(conn)
        if self.release_error is not None:
            raise self.release_error


def open_take(pool: Pool, transaction: Transaction) -> OpenTake:
    return OpenTake(["k1", "k2"], Stamp(1, 0, 1), pool, "conn", transaction)


GONE = asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed")


@pytest.mark.parametrize("release_error", [None, GONE, OSError("reset by peer")])
async def test_a_commit_stands_whatever_giving_the_connection_back_does(
    release_error: BaseException | None,
) -> None:
    pool, transaction = Pool(release_error), Transaction()
    await open_take(pool, transaction).commit()  # returns: the batch is taken
    assert transaction.ended == ["commit"] and pool.released == ["conn"]


async def test_a_failed_commit_is_a_store_outage_and_the_connection_goes_back() -> None:
    pool, transaction = Pool(GONE), Transaction(commit_error=GONE)
    with pytest.raises(StoreUnavailable):
        await open_take(pool, transaction).commit()
    assert pool.released == ["conn"]


async def test_a_rollback_ends_quietly_when_the_connection_cannot_be_reset() -> None:
    pool, transaction = Pool(GONE), Transaction()
    take = open_take(pool, transaction)
    await take.rollback()
    await take.rollback()  # a second one does nothing
    assert transaction.ended == ["rollback"] and pool.released == ["conn"]


class InsertConnection:
    """What insert_keys uses of a connection: a transaction, the fence count, a COPY,
    one statement."""

    def __init__(self, commit_error: BaseException | None = None) -> None:
        self.commit_error = commit_error
        self.ended: list[str] = []

    def transaction(self) -> InsertConnection:
        return self

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: object, *_: object) -> None:
        if kind is not None:
            self.ended.append("rollback")
            return
        if self.commit_error is not None:
            raise self.commit_error
        self.ended.append("commit")

    async def fetchval(self, *_: object) -> int:
        return 0  # the fences count the range was leased under (LeasedRange's default)

    async def fetch(self, *_: object) -> list[object]:
        return []  # no key of the range excluded by an import

    async def copy_records_to_table(self, *_: object, **__: object) -> None:
        return None

    async def execute(self, *_: object) -> None:
        return None


class Acquire:
    """Like asyncpg's pool.acquire(): awaited, or used with ``async with`` (which
    releases on the way out, raising what the release raises)."""

    def __init__(self, pool: InsertPool) -> None:
        self.pool = pool

    def __await__(self) -> Generator[Any, None, InsertConnection]:
        return self._conn().__await__()

    async def _conn(self) -> InsertConnection:
        return self.pool.conn

    async def __aenter__(self) -> InsertConnection:
        return self.pool.conn

    async def __aexit__(self, *_: object) -> None:
        await self.pool.release(self.pool.conn)


class InsertPool(Pool):
    def __init__(self, conn: InsertConnection, release_error: BaseException | None) -> None:
        super().__init__(release_error)
        self.conn = conn

    def acquire(self) -> Acquire:
        return Acquire(self)


async def insert(pool: InsertPool) -> None:
    id_type = IdType("farmer", IdTypeConfig(kind="numeric", length=10), None)
    await ColdStore(pool).insert_keys(  # type: ignore[arg-type]
        id_type, LeasedRange(0, 10), ["k1"], 10, final=True
    )


@pytest.mark.parametrize("release_error", [None, GONE, OSError("reset by peer")])
async def test_a_keygen_insert_stands_whatever_giving_the_connection_back_does(
    release_error: BaseException | None,
) -> None:
    conn = InsertConnection()
    pool = InsertPool(conn, release_error)
    await insert(pool)  # returns: keygen goes on with its range
    assert conn.ended == ["commit"] and pool.released == [conn]


async def test_a_failed_insert_commit_is_a_store_outage_and_the_connection_goes_back() -> None:
    conn = InsertConnection(commit_error=GONE)
    pool = InsertPool(conn, GONE)
    with pytest.raises(StoreUnavailable):
        await insert(pool)
    assert pool.released == [conn]
