"""How a take's transaction ends: its commit or rollback decides the outcome; giving the
connection back afterwards cannot (the pool closes a connection whose reset failed)."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from shared.domain.errors import StoreUnavailable
from shared.stores.cold_store import OpenTake
from shared.stores.sync_record import Stamp


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
