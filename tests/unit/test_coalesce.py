"""Coalescing: concurrent requests share pops; every request gets its own key or none."""

from __future__ import annotations

import asyncio

import pytest

from dispenser.coalesce import Coalescer
from shared.domain.errors import StoreUnavailable
from shared.stores.hot_store import Popped


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
    assert coalescer.served == 200 and coalescer.pops == len(pool.calls)


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
