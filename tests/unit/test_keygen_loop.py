"""keygen's loop on the in-memory ports: watermarks, disjoint ranges, exhaustion.

What the loop decides (when to lease, when to stop, what to do at the keyspace's end)
is checked here without PostgreSQL; what PostgreSQL guarantees (the sequence, the
fence, the cold table's key) is checked against a real server in tests/integration.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from keygen.generation import Generator
from keygen.main import Keygen
from shared.domain.config import Settings, load_settings
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.tiers import LeasedRange
from shared.stores.memory import MemoryCold
from tests.conftest import EMPTY_CONFIG, TEST_SECRET

MARKS: dict[str, Any] = {
    "range_size": 1_000,
    "hot": {"low": 10, "high": 100},
    "cold": {"low": 300, "high": 600},
    "sync_batch": 50,
}
# 3-digit numeric IDs with no check digit: a keyspace of 1,000 counters (3 ranges of 400).
TINY: dict[str, Any] = {
    "kind": "numeric",
    "length": 3,
    "order": "sequential",
    "check_digit": "none",
    "range_size": 400,
    "hot": {"low": 10, "high": 100},
    "cold": {"low": 5_000, "high": 9_000},
    "sync_batch": 50,
}


def settings() -> Settings:
    return load_settings(
        EMPTY_CONFIG,
        permutation_key=TEST_SECRET,
        id_types={"farmer": {"kind": "numeric", "length": 10, **MARKS}, "tiny": TINY},
    )


@pytest.fixture
def generator() -> Iterator[Generator]:
    made = Generator(1)
    yield made
    made.close()


def keygen(cold: MemoryCold, generator: Generator) -> Keygen:
    return Keygen(settings(), cold, cold, asyncio.Event(), generator)


async def test_it_fills_a_type_to_its_high_watermark_then_waits_for_the_low(
    generator: Generator,
) -> None:
    cold = MemoryCold()
    loop = keygen(cold, generator)
    farmer = build_id_types(settings())["farmer"]
    while await loop._needs_keys(farmer):
        await loop.lease_and_generate(farmer)
    assert len(cold.keys["farmer"]) >= 600  # stopped at (or just past) high
    leased = len(cold.ranges)
    cold.take("farmer", len(cold.keys["farmer"]) - 400)  # above low: nothing to do
    assert not await loop._needs_keys(farmer)
    cold.take("farmer", 150)  # below low: fill again
    assert await loop._needs_keys(farmer)
    await loop.lease_and_generate(farmer)
    assert len(cold.ranges) == leased + 1


async def test_its_ranges_are_disjoint_and_every_key_is_valid(generator: Generator) -> None:
    cold = MemoryCold()
    loop = keygen(cold, generator)
    farmer = build_id_types(settings())["farmer"]
    for _ in range(5):
        await loop.lease_and_generate(farmer)
    spans = sorted((start, stop) for name, start, stop in cold.ranges if name == "farmer")
    assert all(a_stop <= b_start for (_, a_stop), (b_start, _) in itertools.pairwise(spans))
    assert all(farmer.validate(key) for key in cold.keys["farmer"])
    stats = await cold.range_stats("farmer")
    assert stats["accepted"] == len(cold.keys["farmer"]) and stats["filled"] == 5


async def test_at_the_keyspace_end_it_stops_leasing_and_says_so(generator: Generator) -> None:
    cold = MemoryCold()
    loop = keygen(cold, generator)
    tiny = build_id_types(settings())["tiny"]
    added = [await loop.lease_and_generate(tiny) for _ in range(4)]
    assert added[-1] == 0 and all(added[:3])  # three ranges, then the end
    assert loop.exhausted("tiny")
    assert not await loop._needs_keys(tiny)  # never leases again
    state = await cold.sequence_state(tiny)
    assert state.headroom == 0


class ShardDown(MemoryCold):
    """farmer's record is on a Redis shard that is down: its leases cannot be recorded."""

    async def lease_range(self, id_type: IdType, lessee: str) -> LeasedRange:
        if id_type.name == "farmer":
            raise StoreUnavailable("redis", "read_record failed: the shard is down")
        return await super().lease_range(id_type, lessee)


async def test_a_type_whose_redis_is_down_does_not_stop_the_others(
    generator: Generator,
) -> None:
    cold = ShardDown()
    loop = keygen(cold, generator)
    assert await loop.step()  # tiny got its range
    assert {name for name, _, _ in cold.ranges} == {"tiny"}
    cold.take("tiny", len(cold.keys["tiny"]))
    cold.next_counter["tiny"] = 10**9  # tiny used up: only farmer is left to serve
    await loop.step()  # finds tiny's keyspace used up
    with pytest.raises(StoreUnavailable):
        await loop.step()  # nothing got a range: the error, for the loop's backoff
