"""keysync's refill on the in-memory ports (``MemoryCold`` as ``ColdInventory``,
``MemoryHot`` as ``HotLists``): what it moves, when, and what it says when the cold
tier is empty. The same ports' real adapters pass the same cases
(tests/integration/test_port_conformance.py); the push's retry policy under faults is
test_keysync_push.py's."""

from __future__ import annotations

from keysync.main import Keysync
from shared.domain.config import load_settings
from shared.domain.idtypes import IdType, build_id_types
from shared.stores.memory import MemoryCold, MemoryHot
from tests.conftest import EMPTY_CONFIG, TEST_SECRET, small_types

LOW, HIGH, BATCH = 200, 1_000, 500  # small_types' hot watermarks and sync_batch


def keysync() -> tuple[Keysync, MemoryCold, MemoryHot, IdType]:
    settings = load_settings(EMPTY_CONFIG, permutation_key=TEST_SECRET, id_types=small_types())
    cold, hot = MemoryCold(), MemoryHot()
    farmer = build_id_types(settings, generating=False)["farmer"]
    return Keysync(settings, cold, hot), cold, hot, farmer


async def test_a_list_below_its_low_watermark_is_topped_up_to_its_high_one() -> None:
    sync, cold, hot, farmer = keysync()
    cold.keys["farmer"] = {f"{i:010d}" for i in range(5_000)}
    hot.fill("farmer", [f"h{i:09d}" for i in range(LOW - 1)])
    moved = await sync.refill(farmer)
    assert moved == HIGH - (LOW - 1)
    assert await hot.depth("farmer") == HIGH
    assert len(cold.keys["farmer"]) == 5_000 - moved  # moved, not copied
    assert len(hot.stamps) == 2  # sync_batch at a time, each push with its take's stamp
    assert [stamp.clock for stamp in hot.stamps] == sorted({s.clock for s in hot.stamps})
    assert hot.refills["farmer"][0] > 0  # the refill rate dispensers read


async def test_a_list_at_its_low_watermark_is_left_alone() -> None:
    sync, cold, hot, farmer = keysync()
    cold.keys["farmer"] = {f"{i:010d}" for i in range(5_000)}
    hot.fill("farmer", [f"h{i:09d}" for i in range(LOW)])
    assert await sync.refill(farmer) == 0
    assert len(cold.keys["farmer"]) == 5_000


async def test_the_next_batch_taken_while_a_push_runs_goes_back_when_not_needed() -> None:
    """The pipelined take (the next batch taken before the push it follows succeeded)
    is rolled back when the list is full: no key is lost between the tiers."""
    sync, cold, hot, farmer = keysync()
    cold.keys["farmer"] = {f"{i:010d}" for i in range(3 * BATCH)}
    moved = await sync.refill(farmer)
    assert moved + len(cold.keys["farmer"]) == 3 * BATCH
    assert await hot.depth("farmer") == moved == HIGH


async def test_an_empty_cold_tier_wakes_keygen_and_a_used_keyspace_is_exhausted() -> None:
    sync, cold, hot, farmer = keysync()
    assert await sync.refill(farmer) == 0
    assert cold.woken == ["farmer"] and not await hot.exhausted("farmer")
    cold.next_counter["farmer"] = farmer.config.counter_stop  # every range leased
    assert await sync.refill(farmer) == 0
    assert await hot.exhausted("farmer")
