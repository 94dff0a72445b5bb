"""A type's pool (``dispenser.sources.Pool``): concurrent requests share pops, every
request gets its own key or none; the prefetch stock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from dispenser.metrics import DispenserMetrics
from dispenser.sources import LedgerBacklog, Pool
from shared.domain.apikeys import ANONYMOUS
from shared.domain.config import load_settings
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import build_id_types
from shared.domain.imports import STOCK_FRESH_S
from shared.domain.ports import HotPool
from shared.domain.tiers import Popped
from shared.stores.memory import MemoryHot, MemoryLedger, MemoryNudges
from tests.conftest import EMPTY_CONFIG, TEST_SECRET


class FakePool:
    """A list of keys popped with a delay, recording every call (pure logic only)."""

    def __init__(self, keys: int) -> None:
        self.keys = [f"k{i}" for i in range(keys)]
        self.calls: list[tuple[int, list[str]]] = []
        self.fail = False
        self.epoch = 0  # the stock epoch (an import moves it on)
        self.epoch_reads = 0

    async def stock_epoch(self, name: str, hold_ms: int) -> int:
        self.epoch_reads += 1
        if self.fail:
            raise StoreUnavailable("redis", "down")
        return self.epoch

    async def pop_coalesced(
        self, name: str, count: int, clients: Sequence[str] = (), ledger: bool = False
    ) -> Popped:
        self.calls.append((count, list(clients)))
        await asyncio.sleep(0.001)
        if self.fail:
            raise StoreUnavailable("redis", "down")
        taken, self.keys = self.keys[:count], self.keys[count:]
        return Popped(taken, len(self.keys), exhausted=False)


def pool_of(
    fake: FakePool,
    max_batch: int,
    ahead: int = 0,
    lost: list[tuple[str, int]] | None = None,
    name: str = "t",
) -> Pool:
    """Pool ``name`` popping from ``fake`` (a stock of ``ahead`` keys); keys it counts
    lost are appended to ``lost``."""
    settings = load_settings(
        EMPTY_CONFIG,
        permutation_key=TEST_SECRET,
        id_types={name: {"kind": "numeric", "length": 10, "prefetch": ahead}},
        dispenser={"max_batch": max_batch},
    )
    metrics = DispenserMetrics(CollectorRegistry())
    stream = MemoryLedger(MemoryHot())
    id_type = build_id_types(settings, generating=False)[name]
    pool = Pool(
        id_type,
        cast(HotPool, fake),
        MemoryNudges(),
        stream,
        LedgerBacklog(stream, metrics, settings.dispenser),
        metrics,
        settings.dispenser,
    )
    if lost is not None:
        pool.lost = lambda count: lost.append((name, count))  # type: ignore[method-assign]
    return pool


async def test_concurrent_requests_share_pops_and_get_distinct_keys() -> None:
    hot = FakePool(1_000)
    pool = pool_of(hot, max_batch=1_000)
    results = await asyncio.gather(*(pool.join("c") for _ in range(200)))
    keys = [key for key, _ in results if key is not None]
    assert sorted(keys) == sorted(f"k{i}" for i in range(200))
    assert len(hot.calls) < 10  # the first pop takes one, the next the ones that queued
    assert sum(count for count, _ in hot.calls) == 200


async def test_batches_never_exceed_max_batch() -> None:
    hot = FakePool(1_000)
    pool = pool_of(hot, max_batch=16)
    await asyncio.gather(*(pool.join("c") for _ in range(100)))
    assert max(count for count, _ in hot.calls) <= 16


async def test_requests_beyond_the_pool_get_none() -> None:
    hot = FakePool(5)
    pool = pool_of(hot, max_batch=100)
    results = await asyncio.gather(*(pool.join("c") for _ in range(8)))
    keys = [key for key, _ in results]
    assert sorted(k for k in keys if k is not None) == [f"k{i}" for i in range(5)]
    assert keys.count(None) == 3


async def test_clients_are_named_per_key_or_once_for_all() -> None:
    hot = FakePool(100)
    pool = pool_of(hot, max_batch=100)
    await pool.join("only")
    await asyncio.gather(pool.join("a"), pool.join("a"))
    await asyncio.gather(*(pool.join(name) for name in ("a", "b", "c")))
    assert hot.calls[0] == (1, ["only"])
    assert (2, ["a"]) in hot.calls
    assert (3, ["a", "b", "c"]) in hot.calls


async def test_a_failed_pop_fails_its_waiters_and_the_next_pop_recovers() -> None:
    hot = FakePool(100)
    pool = pool_of(hot, max_batch=100)
    hot.fail = True
    with pytest.raises(StoreUnavailable):
        await pool.join("c")
    hot.fail = False
    key, _ = await pool.join("c")
    assert key == "k0"


async def test_types_are_coalesced_separately() -> None:
    hot = FakePool(100)
    a, b = pool_of(hot, max_batch=100, name="a"), pool_of(hot, max_batch=100, name="b")
    await asyncio.gather(a.join("c"), b.join("c"))
    assert len(hot.calls) == 2


async def test_keys_popped_for_a_waiter_that_is_gone_are_counted() -> None:
    hot = FakePool(10)
    lost: list[tuple[str, int]] = []
    pool = pool_of(hot, max_batch=100, lost=lost)
    first = asyncio.ensure_future(pool.join("c"))
    gone = asyncio.ensure_future(pool.join("c"))
    await asyncio.sleep(0)  # both queued; the pop is in flight
    gone.cancel()
    key, _ = await first
    assert key == "k0"
    assert lost == [("t", 1)]  # k1 was popped for the cancelled waiter
    assert hot.keys == [f"k{i}" for i in range(2, 10)]


# The prefetch stock (``ahead``): keys popped ahead of requests, handed out without a pop.


async def stocked_pool(keys: int, ahead: int = 8) -> tuple[FakePool, Pool, list[tuple[str, int]]]:
    """A pool whose first pop has shown a plentiful list, so its stock fills."""
    hot = FakePool(keys)
    lost: list[tuple[str, int]] = []
    pool = pool_of(hot, max_batch=100, ahead=ahead, lost=lost)
    key, _ = await pool.join("c")  # the first pop takes only for its waiter
    assert key == "k0" and hot.calls == [(1, [ANONYMOUS])] and pool.stocked() == 0
    return hot, pool, lost


async def test_a_stock_fills_with_the_next_pop_and_answers_without_one() -> None:
    hot, pool, _ = await stocked_pool(1_000)
    key, _ = await pool.join("c")  # its pop takes the stock too
    assert key == "k1" and hot.calls[-1] == (1 + 8, [ANONYMOUS])
    assert pool.stocked() == 8
    calls = len(hot.calls)
    assert [pool.ready() for _ in range(4)] == ["k2", "k3", "k4", "k5"]
    assert len(hot.calls) == calls  # handed out with no pop
    assert pool.handed_out() == 4  # counted as issued by the pool


async def test_a_stock_down_to_half_is_refilled_by_a_pop_of_its_own() -> None:
    hot, pool, _ = await stocked_pool(1_000)
    await pool.join("c")
    for _ in range(4):  # 8 -> 4: half
        pool.ready()
    await asyncio.sleep(0.01)  # the refill pop runs in the background
    assert hot.calls[-1] == (4, [ANONYMOUS]) and pool.stocked() == 8


async def test_a_near_empty_list_gets_no_stock_taken_from_it() -> None:
    # 30 keys: under PLENTY (4) x 8 after the first pop; each request pops for itself.
    hot, pool, _ = await stocked_pool(30)
    await asyncio.gather(*(pool.join("c") for _ in range(5)))
    assert all(count <= 5 for count, _ in hot.calls) and pool.stocked() == 0
    assert sum(count for count, _ in hot.calls) == 6


async def test_stock_and_pops_never_hand_out_a_key_twice() -> None:
    hot, pool, _ = await stocked_pool(2_000, ahead=16)
    handed = ["k0"]

    async def one() -> None:
        key = pool.ready()
        if key is None:
            key, _ = await pool.join("c")
        assert key is not None
        handed.append(key)

    for _ in range(20):
        await asyncio.gather(*(one() for _ in range(37)))
    assert len(handed) == len(set(handed)) == 1 + 20 * 37
    left = set(hot.keys) | set(pool._stock or ())
    assert not left & set(handed) and len(left) + len(handed) == 2_000


async def test_a_waiter_that_is_gone_gives_its_key_to_the_stock() -> None:
    _hot, pool, lost = await stocked_pool(1_000)
    await pool.join("c")  # stock: 8
    for _ in range(8):
        pool.ready()
    await asyncio.sleep(0.01)  # refilled to 8 meanwhile? drain it again
    while pool.ready() is not None:
        pass
    first = asyncio.ensure_future(pool.join("c"))
    gone = asyncio.ensure_future(pool.join("c"))
    await asyncio.sleep(0)
    gone.cancel()
    await first
    assert lost == []  # not lost: stocked, for the next request
    assert pool.stocked() >= 1


async def test_a_stopping_process_counts_its_stock_as_lost() -> None:
    _hot, pool, lost = await stocked_pool(1_000)
    await pool.join("c")
    pool.ready()
    pool.drop_stock()
    assert lost == [("t", 7)] and pool.stocked() == 0
    assert pool.ready() is None
    assert pool.handed_out() == 1  # the dropped keys were not issued


async def test_a_failed_refill_leaves_the_error_to_the_next_request() -> None:
    hot, pool, _ = await stocked_pool(1_000)
    await pool.join("c")
    hot.fail = True
    for _ in range(8):
        assert pool.ready() is not None  # the refills fail in the background
    await asyncio.sleep(0.01)
    with pytest.raises(StoreUnavailable):
        await pool.join("c")
    hot.fail = False
    key, _ = await pool.join("c")
    assert key is not None


async def test_keys_a_pop_brings_after_the_stop_are_counted_lost() -> None:
    """A refill still in flight when the process stops: its keys reach no stock (nobody
    would hand them out) and are counted lost, as the stock itself is."""
    hot, pool, lost = await stocked_pool(1_000)
    await pool.join("c")  # stock: 8
    for _ in range(4):  # down to half: a refill pop starts
        pool.ready()
    await asyncio.sleep(0)  # the refill's pop is in flight
    assert pool._draining and hot.calls[-1] == (4, [ANONYMOUS])
    await pool.close()  # the stop, while that pop is in flight
    assert lost == [("t", 4)]  # the stock held
    await asyncio.sleep(0.01)  # the pop lands
    assert lost == [("t", 4), ("t", 4)] and pool.stocked() == 0
    assert pool.handed_out() == 4
    assert len(hot.calls) == 3  # and no pop after it


# A stock after an import (STOCK_FRESH_S): never handed out once the stock epoch moved.


class Clock:
    """Time as the pool tells it, moved on by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


async def test_an_import_moving_the_stock_epoch_drops_the_stock() -> None:
    hot, pool, lost = await stocked_pool(1_000)
    pool.clock = clock = Clock()
    await pool.join("c")
    stocked = [f"k{i}" for i in range(2, 10)]
    assert pool.stocked() == 8 and pool.ready() == stocked[0]
    hot.epoch = 1  # an import swept the hot list, then moved the epoch on
    clock.now += STOCK_FRESH_S  # no read of the epoch since: the stock is stale
    assert pool.ready() is None
    key, _ = await pool.join("c")  # reads the epoch, drops the stock, pops
    assert key not in stocked and pool.stocked() < 8 + 1
    assert all(k not in stocked for k in list(pool._stock or ()))
    assert lost == [("t", 7)]


async def test_a_stock_whose_epoch_cannot_be_read_is_not_handed_out() -> None:
    hot, pool, _ = await stocked_pool(1_000)
    pool.clock = clock = Clock()
    await pool.join("c")
    clock.now += STOCK_FRESH_S
    hot.fail = True
    assert pool.ready() is None
    with pytest.raises(StoreUnavailable):
        await pool.join("c")
    hot.fail = False
    key, _ = await pool.join("c")  # read again: unchanged, the stock is good
    assert key == "k2" and pool.ready() == "k3"
