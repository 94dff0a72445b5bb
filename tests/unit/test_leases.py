"""Lease pools and the holder's own view of its lease (pure logic)."""

from __future__ import annotations

import signal
import time

import pytest

from shared.cli.lease import exit_status, format_holders, report
from shared.domain.errors import ConfigError
from shared.domain.leases import MAX_POOL_IDS, check_pool, check_ttl, safety_margin_s
from shared.leases.holder import MachineLease
from shared.leases.store import Acquired, Holder, Holders


@pytest.mark.parametrize(
    ("pool", "lo", "hi"),
    [
        ("Prod", 0, 1),
        ("prod:x", 0, 1),
        ("", 0, 1),
        ("p", 2, 1),
        ("p", -1, 3),
        ("p", 0, MAX_POOL_IDS),
    ],
)
def test_bad_pools_and_ranges_are_refused(pool: str, lo: int, hi: int) -> None:
    with pytest.raises(ConfigError):
        check_pool(pool, lo, hi)


def test_good_pools_pass() -> None:
    check_pool("prod", 0, 1023)
    check_pool("shard_7", 5, 5)
    check_pool("p", 0, MAX_POOL_IDS - 1)


def test_renewals_must_come_well_within_the_ttl() -> None:
    check_ttl(10, 1)
    for ttl, every in ((10, 4), (10, 0), (0.05, 0.01)):
        with pytest.raises(ConfigError):
            check_ttl(ttl, every)


def test_the_margin_is_a_tenth_of_the_ttl_at_most_a_second() -> None:
    assert safety_margin_s(0.5) == pytest.approx(0.05)
    assert safety_margin_s(60) == 1.0


def lease(ttl_s: float = 10.0) -> MachineLease:
    granted = Acquired("granted", 7, 100, "token@1", 0)
    return MachineLease("p", granted, "me#1", ttl_s, time.monotonic(), 5_000)


def test_a_lease_is_valid_until_lost() -> None:
    held = lease()
    assert held.valid() and held.machine_id == 7 and held.floor_ms == 100
    held.lose("fenced")
    held.lose("later reason")  # the first reason stays
    assert not held.valid() and held.lost.is_set() and held.lost_reason == "fenced"


def test_the_deadline_is_the_send_time_plus_ttl_minus_the_margin() -> None:
    sent = time.monotonic()
    held = MachineLease("p", Acquired("granted", 1, 0, "e", 0), "me", 10.0, sent, 0)
    assert held.deadline == pytest.approx(sent + 9.0)
    held.extended(sent - 20, 0)  # a renewal sent long ago: its deadline has passed
    assert not held.valid() and not held.lost.is_set()


def test_the_ceiling_never_goes_down_and_issued_keeps_the_latest() -> None:
    held = lease()
    held.extended(time.monotonic(), 9_000)
    held.extended(time.monotonic(), 8_000)  # the wall clock stepped back
    assert held.ceiling_ms() == 9_000
    assert held.issued_ms is None
    held.note_issued(4_000)
    held.note_issued(3_000)
    assert held.issued_ms == 4_000


def test_exit_status_follows_the_shell_convention() -> None:
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-signal.SIGTERM) == 143 and exit_status(-signal.SIGKILL) == 137


def test_the_holder_listing_shows_each_lease_and_a_settle_period() -> None:
    found = Holders([Holder(4, "host-1:svc#ab", 1_700_000_000_000, 2_500, 99)], 1_200, {4: 99})
    shown = report("prod", found)
    assert shown["holders"] == [
        {
            "id": 4,
            "owner": "host-1:svc#ab",
            "since": "2023-11-14T22:13:20.000+00:00",
            "expires_in_s": 2.5,
            "last_ms": 99,
        }
    ]
    text = format_holders(shown)
    assert "pool prod: 1 held; grants resume in 1.2s" in text
    assert "host-1:svc#ab" in text.splitlines()[2]


async def test_the_library_refuses_an_endpoint_that_names_no_redis() -> None:
    """A machine ID is unique among one Redis's holders: an endpoint built without a
    URL, Sentinel or cluster would lease from whatever answers at 127.0.0.1:6379. The
    refusal comes before any connection (no server runs for this test)."""
    from shared.leases.holder import SyncMachineLease, lease_machine_id
    from shared.stores.redis.endpoint import RedisEndpoint

    with pytest.raises(ConfigError, match="names no Redis"):
        async with lease_machine_id(RedisEndpoint(), "orders", 0, 1023):
            pass
    with pytest.raises(ConfigError, match="names no Redis"):
        SyncMachineLease(RedisEndpoint(), "orders", 0, 1023)
    assert RedisEndpoint("redis://127.0.0.1:6379/0").named
