"""Sites: each stack leases only its share of a type's counters, so stacks with one
permutation key and different site indexes never produce the same key.

The whole counter domain of a small type is leased to exhaustion in one database per
site (real PostgreSQL sequences, real keys): the shares tile the domain, the key sets
never meet, and together they are exactly what one stack without a site generates.
The same with complete stacks (keygen, keysync, dispenser over HTTP, Redis apiece) is
in tests/acceptance/test_sites.py.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

from shared.cli.status import collect_status, format_status
from shared.domain.config import Settings
from shared.domain.errors import KeyspaceChanged, KeyspaceExhausted
from shared.domain.idtypes import build_id_types
from shared.stores.fence.postgres_fence import settle
from shared.stores.fence.sync_record import UNGUARDED, SyncRecord
from shared.stores.postgres.cold_store import ColdStore
from shared.stores.postgres.databases import drop_database, run_migrate, scratch_database
from shared.stores.postgres.schema import migrate
from tests.integration.fixtures import Servers, make_settings

DOMAIN = 10_000  # numeric length 5: four counter digits and the check digit
RANGE = 700  # no divisor of a share: the last range of each share is clipped


def tiny(site: dict[str, int] | None) -> dict[str, Any]:
    """One small permuted type, optionally a site's share of it."""
    config: dict[str, Any] = {"kind": "numeric", "length": 5, "range_size": RANGE}
    return {"tiny": config | ({"site": site} if site is not None else {})}


def database_of(settings: Settings) -> str:
    return str(settings.postgres_dsn).rsplit("/", 1)[-1]


@asynccontextmanager
async def stack_database(servers: Servers, site: dict[str, int] | None) -> AsyncIterator[Settings]:
    """A database of its own, migrated for ``tiny`` with ``site``."""
    name = f"kd_site_{os.getpid()}_{'all' if site is None else site['index']}"
    await scratch_database(servers.postgres_admin_dsn, name)
    try:
        settings = make_settings(servers, name, id_types=tiny(site))
        await run_migrate(settings)
        yield settings
    finally:
        await drop_database(servers.postgres_admin_dsn, name)


async def lease_all(settings: Settings) -> tuple[list[tuple[int, int]], set[str]]:
    """Every range the database will lease, until its sequence is exhausted, and the
    keys of all of them."""
    id_type = build_id_types(settings)["tiny"]
    cold = await ColdStore.connect(settings.postgres_dsn)
    ranges: list[tuple[int, int]] = []
    keys: set[str] = set()
    try:
        for _ in range(DOMAIN // RANGE + 2):
            try:
                leased, _stamp = await cold.lease_range(id_type, "test", UNGUARDED)
            except KeyspaceExhausted:
                break
            ranges.append((leased.start, leased.stop))
            made, _candidates = id_type.generate(leased.start, leased.stop)
            assert keys.isdisjoint(made)
            keys.update(made)
        else:
            pytest.fail("the sequence was never exhausted")
        state = await cold.sequence_state(id_type)
        assert (state.leased_counters, state.headroom) == (id_type.config.counter_share, 0)
    finally:
        await cold.close()
    return ranges, keys


async def test_three_sites_tile_the_domain_and_never_share_a_key(servers: Servers) -> None:
    keys_by_site: list[set[str]] = []
    for index in range(3):
        async with stack_database(servers, {"index": index, "of": 3}) as settings:
            ranges, keys = await lease_all(settings)
        lo, hi = DOMAIN * index // 3, DOMAIN * (index + 1) // 3
        # Contiguous from the share's start to its end, the last range clipped there.
        assert ranges[0][0] == lo and ranges[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        keys_by_site.append(keys)
    async with stack_database(servers, None) as settings:
        ranges, everything = await lease_all(settings)
    assert (ranges[0][0], ranges[-1][1]) == (0, DOMAIN)
    for i in range(3):
        for j in range(i + 1, 3):
            assert keys_by_site[i].isdisjoint(keys_by_site[j])
    assert set().union(*keys_by_site) == everything
    assert len(everything) > 1_000


async def test_a_duplicated_site_index_generates_the_same_keys(servers: Servers) -> None:
    """The control case: what the site index prevents."""
    site = {"index": 1, "of": 3}
    async with stack_database(servers, site) as settings:
        _, first = await lease_all(settings)
    async with stack_database(servers, site) as settings:
        _, second = await lease_all(settings)
    assert first == second and first


async def test_a_changed_site_is_refused_once_counters_were_leased(servers: Servers) -> None:
    async with stack_database(servers, {"index": 0, "of": 2}) as settings:
        # Before any lease the share may still be redefined: the sequence moves to it.
        moved = make_settings(servers, database_of(settings), id_types=tiny({"index": 1, "of": 2}))
        await run_migrate(moved)
        id_type = build_id_types(moved)["tiny"]
        cold = await ColdStore.connect(moved.postgres_dsn)
        try:
            leased, _ = await cold.lease_range(id_type, "test", UNGUARDED)
        finally:
            await cold.close()
        assert leased.start == DOMAIN // 2
        # Now every change is refused: another index, another split, or no site at all
        # (which would lease the other site's counters).
        conn = await asyncpg.connect(moved.postgres_dsn)
        try:
            for site in ({"index": 0, "of": 2}, {"index": 1, "of": 4}, None):
                changed = make_settings(servers, database_of(settings), id_types=tiny(site))
                with pytest.raises(KeyspaceChanged, match=r"id_types\.tiny\.site"):
                    await migrate(conn, build_id_types(changed))
        finally:
            await conn.close()


async def test_a_site_added_to_a_type_with_leases_is_refused(servers: Servers) -> None:
    async with stack_database(servers, None) as settings:
        cold = await ColdStore.connect(settings.postgres_dsn)
        try:
            await cold.lease_range(build_id_types(settings)["tiny"], "test", UNGUARDED)
        finally:
            await cold.close()
        sited = make_settings(servers, database_of(settings), id_types=tiny({"index": 0, "of": 2}))
        with pytest.raises(KeyspaceChanged, match=r"id_types\.tiny\.site"):
            await run_migrate(sited)


async def test_status_and_a_fence_count_and_keep_the_share(
    servers: Servers, sync: SyncRecord
) -> None:
    """``status`` reports the share and its headroom; an operator's fence that skips
    ranges on a type never leased moves its sequence within the share."""
    async with stack_database(servers, {"index": 2, "of": 4}) as settings:
        types = build_id_types(settings)
        cold = await ColdStore.connect(settings.postgres_dsn)
        try:
            fenced = await settle(cold, sync, types, skip_ranges=2)
            assert fenced is not None
            assert fenced.next_starts["tiny"] == DOMAIN // 2 + 2 * RANGE
            leased, _ = await cold.lease_range(types["tiny"], "test", UNGUARDED)
            assert leased.start == DOMAIN // 2 + 2 * RANGE
        finally:
            await cold.close()
        report = await collect_status(settings)
        assert "site 2 of 4: counters [5000, 7500)" in format_status(report)
        status = report["id_types"]["tiny"]
        assert status["site"] == {"index": 2, "of": 4}
        assert status["counter_range"] == [DOMAIN // 2, DOMAIN * 3 // 4]
        assert status["counters_leased"] == 3 * RANGE  # the skipped ranges and the lease
        assert status["counters_headroom"] == DOMAIN // 4 - 3 * RANGE
        assert status["headroom_fraction"] == pytest.approx(1 - 3 * RANGE / (DOMAIN // 4))


async def test_a_process_with_a_stale_configuration_never_leases_past_the_share(
    servers: Servers,
) -> None:
    """A keygen started before `migrate` gave the type its site still believes the whole
    domain is its own: its leases stop where the sequence does."""
    async with stack_database(servers, {"index": 0, "of": 2}) as settings:
        stale = build_id_types(make_settings(servers, database_of(settings), id_types=tiny(None)))
        cold = await ColdStore.connect(settings.postgres_dsn)
        ends = []
        try:
            for _ in range(DOMAIN // RANGE + 2):
                try:
                    leased, _ = await cold.lease_range(stale["tiny"], "stale", UNGUARDED)
                except KeyspaceExhausted:
                    break
                ends.append(leased.stop)
        finally:
            await cold.close()
        assert ends and max(ends) == DOMAIN // 2
