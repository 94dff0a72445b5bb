"""keysync's refill rate, and the Retry-After dispensers derive from it."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from dispenser.metrics import DispenserMetrics
from dispenser.service import Dispenser, Stores
from keysync.main import RefillMeter
from shared.domain.config import load_settings
from shared.domain.tiers import Popped, Refill
from shared.stores.memory import MemoryHot, MemoryLedger, MemoryNudges
from tests.conftest import EMPTY_CONFIG, TEST_SECRET, small_types


def test_the_refill_rate_is_keys_over_the_recent_window() -> None:
    meter = RefillMeter()
    assert meter.pushed(500, now=100.0) == 500  # one push: at least a second
    assert meter.pushed(500, now=102.0) == 500  # 1000 keys over 2 s
    assert meter.pushed(100, now=115.0) == 100  # the older pushes left the window


@pytest.fixture
def dispenser() -> Dispenser:
    settings = load_settings(
        EMPTY_CONFIG,
        permutation_key=TEST_SECRET,
        id_types=small_types(),  # sync_batch 500, hot.high 1000
        dispenser={"retry_after_s": 2, "retry_after_max_s": 30},
    )
    hot = MemoryHot()
    ledger = MemoryLedger(hot)
    stores = Stores(hot, MemoryNudges(), ledger, ledger)
    return Dispenser(settings, stores, DispenserMetrics(CollectorRegistry()))


@pytest.mark.parametrize(
    ("rate", "age_s", "expected"),
    [
        (None, 0.0, 2),  # nothing known: the configured value
        (0.0, 0.0, 2),
        (250.0, 3600.0, 2),  # stale
        (250.0, 1.0, 2),  # 500 keys at 250/s
        (60.0, 1.0, 9),
        (1_000_000.0, 1.0, 1),
        (1.0, 1.0, 30),  # capped
    ],
)
def test_retry_after_is_the_time_to_the_next_batch(
    dispenser: Dispenser, rate: float | None, age_s: float, expected: int
) -> None:
    refill = None if rate is None else Refill(rate=rate, at=time.time() - age_s)
    popped = Popped([], 0, exhausted=False, refill=refill)
    assert dispenser.pools["farmer"].retry_after(popped) == expected
