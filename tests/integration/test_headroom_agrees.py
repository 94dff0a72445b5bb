"""keygen's kd_keyspace_headroom_ratio and `keydispenser status` agree: both read the
type's sequence, which other keygens, `fill` and fences move as well as this keygen's
own leases."""

from __future__ import annotations

import asyncio

import pytest

import keygen.main
from keygen.generation import Generator
from keygen.main import Keygen
from shared.cli.status import collect_status
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.stores.postgres.cold_store import ColdStore
from tests.conftest import small_types
from tests.integration.fixtures import Servers, make_settings


def gauge(keygen_: Keygen, name: str, id_type: str) -> float:
    value = keygen_.metrics.registry.get_sample_value(name, {"id_type": id_type})
    assert value is not None
    return value


async def test_the_metric_follows_leases_made_elsewhere(
    servers: Servers, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keygen.main, "HEADROOM_EVERY_S", 0.0)
    types = small_types()
    types["farmer"]["cold"] = {"low": 1, "high": 2}  # one range fills it: then idle
    settings: Settings = make_settings(servers, database, id_types=types)
    cold = await ColdStore.connect(settings.postgres_dsn)
    generator = Generator(1)
    try:
        ours = Keygen.on_postgres(settings, cold, None, asyncio.Event(), generator)
        other = Keygen.on_postgres(settings, cold, None, asyncio.Event(), generator)
        farmer = build_id_types(settings)["farmer"]
        await ours.lease_and_generate(farmer)
        for _ in range(3):  # another keygen (or `fill`) leases on
            await other.lease_and_generate(farmer)
        await ours.step()  # full: nothing to lease, but it looks at the sequence
        status = (await collect_status(settings))["id_types"]["farmer"]
    finally:
        generator.close()
        await cold.close()
    assert gauge(ours, "kd_keyspace_headroom_ratio", "farmer") == status["headroom_fraction"]
    assert gauge(ours, "kd_keyspace_counters_headroom", "farmer") == status["counters_headroom"]
