"""Coalescing: concurrent requests share pops; every request gets its own key or none."""

from __future__ import annotations

import asyncio

import pytest

from dispenser.coalesce import Coalescer
from shared.domain.apikeys import ANONYMOUS
from shared.domain.errors import StoreUnavailable
from shared.domain.tiers import Popped


class FakePool:
    """A list of keys popped with a delay, recording every call (pure logic only)."""

    def __init__(self, keys: int) -> None:
        self.keys = [f"k{i}" for i in range(keys)]
        self.calls: list[tuple[int, list[str]]] = []
        self.fail = False

    async def pop_many(self, name: str, count: int, clients: list[str]) -> Popped:
        self.calls.append((count, clients))
        await asyncio.sleep(0.001)
        if self.fail:
            raise StoreUnavailable("redis", "down")
        taken, self.keys = self.keys[:count], self.keys[count:]
        return Popped(taken, len(self.keys), exhausted=False)


async def test_concurrent_requests_share_pops_and_get_distinct_keys() -> None:
    pool = FakePool(1_000)
    coalescer = Coalescer(pool.pop_many, max_batch=1_000)
    results = await asyncio.gather(*(coalescer.take("t", "c") for _ in range(200)))
    keys = [key for key, _ in results if key is not None]
    assert sorted(keys) == sorted(f"k{i}" for i in range(200))
    assert len(pool.calls) < 10  # the first pop takes one, the next the ones that queued
    assert sum(count for count, _ in pool.calls) == 200


async def test_batches_never_exceed_max_batch() -> None:
    pool = FakePool(1_000)
    coalescer = Coalescer(pool.pop_many, max_batch=16)
    await asyncio.gather(*(coalescer.take("t", "c") for _ in range(100)))
    assert max(count for count, _ in pool.calls) <= 16


async def test_requests_beyond_the_pool_get_none() -> None:
    pool = FakePool(5)
    coalescer = Coalescer(pool.pop_many, max_batch=100)
    results = await asyncio.gather(*(coalescer.take("t", "c") for _ in range(8)))
    keys = [key for key, _ in results]
    assert sorted(k for k in keys if k is not None) == [f"k{i}" for i in range(5)]
    assert keys.count(None) == 3


async def test_clients_are_named_per_key_or_once_for_all() -> None:
    pool = FakePool(100)
    coalescer = Coalescer(pool.pop_many, max_batch=100)
    await coalescer.take("t", "only")
    await asyncio.gather(coalescer.take("t", "a"), coalescer.take("t", "a"))
    await asyncio.gather(*(coalescer.take("t", name) for name in ("a", "b", "c")))
    assert pool.calls[0] == (1, ["only"])
    assert (2, ["a"]) in pool.calls
    assert (3, ["a", "b", "c"]) in pool.calls


async def test_a_failed_pop_fails_its_waiters_and_the_next_pop_recovers() -> None:
    pool = FakePool(100)
    coalescer = Coalescer(pool.pop_many, max_batch=100)
    pool.fail = True
    with pytest.raises(StoreUnavailable):
        await coalescer.take("t", "c")
    pool.fail = False
    key, _ = await coalescer.take("t", "c")
    assert key == "k0"


async def test_types_are_coalesced_separately() -> None:
    pool = FakePool(100)
    coalescer = Coalescer(pool.pop_many, max_batch=100)
    await asyncio.gather(coalescer.take("a", "c"), coalescer.take("b", "c"))
    assert len(pool.calls) == 2


async def test_keys_popped_for_a_waiter_that_is_gone_are_counted() -> None:
    pool = FakePool(10)
    lost: list[tuple[str, int]] = []
    coalescer = Coalescer(pool.pop_many, max_batch=100, lost=lambda n, c: lost.append((n, c)))
    first = asyncio.ensure_future(coalescer.take("t", "c"))
    gone = asyncio.ensure_future(coalescer.take("t", "c"))
    await asyncio.sleep(0)  # both queued; the pop is in flight
    gone.cancel()
    key, _ = await first
    assert key == "k0"
    assert lost == [("t", 1)]  # k1 was popped for the cancelled waiter
    assert pool.keys == [f"k{i}" for i in range(2, 10)]


# The prefetch stock (``ahead``): keys popped ahead of requests, handed out without a pop.


async def stocked_coalescer(
    keys: int, ahead: int = 8
) -> tuple[FakePool, Coalescer, list[tuple[str, int]]]:
    """A coalescer whose first pop has shown a plentiful list, so its stock fills."""
    pool = FakePool(keys)
    lost: list[tuple[str, int]] = []
    coalescer = Coalescer(
        pool.pop_many, max_batch=100, lost=lambda n, c: lost.append((n, c)), ahead={"t": ahead}
    )
    key, _ = await coalescer.take("t", "c")  # the first pop takes only for its waiter
    assert key == "k0" and pool.calls == [(1, [ANONYMOUS])] and coalescer.stocked() == {"t": 0}
    return pool, coalescer, lost


async def test_a_stock_fills_with_the_next_pop_and_answers_without_one() -> None:
    pool, coalescer, _ = await stocked_coalescer(1_000)
    key, _ = await coalescer.take("t", "c")  # its pop takes the stock too
    assert key == "k1" and pool.calls[-1] == (1 + 8, [ANONYMOUS])
    assert coalescer.stocked() == {"t": 8}
    calls = len(pool.calls)
    assert [coalescer.ready("t") for _ in range(4)] == ["k2", "k3", "k4", "k5"]
    assert len(pool.calls) == calls  # handed out with no pop
    assert coalescer.handed_out() == {"t": 4}  # counted as issued by the coalescer


async def test_a_stock_down_to_half_is_refilled_by_a_pop_of_its_own() -> None:
    pool, coalescer, _ = await stocked_coalescer(1_000)
    await coalescer.take("t", "c")
    for _ in range(4):  # 8 -> 4: half
        coalescer.ready("t")
    await asyncio.sleep(0.01)  # the refill pop runs in the background
    assert pool.calls[-1] == (4, [ANONYMOUS]) and coalescer.stocked() == {"t": 8}


async def test_a_near_empty_list_gets_no_stock_taken_from_it() -> None:
    # 30 keys: under PLENTY (4) x 8 after the first pop; each request pops for itself.
    pool, coalescer, _ = await stocked_coalescer(30)
    await asyncio.gather(*(coalescer.take("t", "c") for _ in range(5)))
    assert all(count <= 5 for count, _ in pool.calls) and coalescer.stocked() == {"t": 0}
    assert sum(count for count, _ in pool.calls) == 6


async def test_stock_and_pops_never_hand_out_a_key_twice() -> None:
    pool, coalescer, _ = await stocked_coalescer(2_000, ahead=16)
    handed = ["k0"]

    async def one() -> None:
        key = coalescer.ready("t")
        if key is None:
            key, _ = await coalescer.take("t", "c")
        assert key is not None
        handed.append(key)

    for _ in range(20):
        await asyncio.gather(*(one() for _ in range(37)))
    assert len(handed) == len(set(handed)) == 1 + 20 * 37
    left = set(pool.keys) | set(coalescer._stock["t"])
    assert not left & set(handed) and len(left) + len(handed) == 2_000


async def test_a_waiter_that_is_gone_gives_its_key_to_the_stock() -> None:
    _pool, coalescer, lost = await stocked_coalescer(1_000)
    await coalescer.take("t", "c")  # stock: 8
    for _ in range(8):
        coalescer.ready("t")
    await asyncio.sleep(0.01)  # refilled to 8 meanwhile? drain it again
    while coalescer.ready("t") is not None:
        pass
    first = asyncio.ensure_future(coalescer.take("t", "c"))
    gone = asyncio.ensure_future(coalescer.take("t", "c"))
    await asyncio.sleep(0)
    gone.cancel()
    await first
    assert lost == []  # not lost: stocked, for the next request
    assert coalescer.stocked()["t"] >= 1


async def test_a_stopping_process_counts_its_stock_as_lost() -> None:
    _pool, coalescer, lost = await stocked_coalescer(1_000)
    await coalescer.take("t", "c")
    coalescer.ready("t")
    coalescer.drop_stock()
    assert lost == [("t", 7)] and coalescer.stocked() == {"t": 0}
    assert coalescer.ready("t") is None
    assert coalescer.handed_out() == {"t": 1}  # the dropped keys were not issued


async def test_a_failed_refill_leaves_the_error_to_the_next_request() -> None:
    pool, coalescer, _ = await stocked_coalescer(1_000)
    await coalescer.take("t", "c")
    pool.fail = True
    for _ in range(8):
        assert coalescer.ready("t") is not None  # the refills fail in the background
    await asyncio.sleep(0.01)
    with pytest.raises(StoreUnavailable):
        await coalescer.take("t", "c")
    pool.fail = False
    key, _ = await coalescer.take("t", "c")
    assert key is not None
