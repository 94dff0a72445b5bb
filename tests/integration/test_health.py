"""keygen's and keysync's probes: /healthz says the process loop is alive (it beat
recently), /readyz that it started and its last iteration reached its stores."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from keygen.generation import Generator
from keygen.main import Keygen
from keysync.main import Keysync, run
from shared.domain.config import Settings
from shared.domain.idtypes import build_id_types
from shared.metrics import Heartbeat, serve
from shared.stores.fence.guarded import GuardedCold
from shared.stores.fence.sync_record import SyncRecord
from shared.stores.hot.hot_store import HotStore
from shared.stores.hot.wake import WakeChannel
from shared.stores.postgres.cold_store import ColdStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_heartbeat_is_alive_while_starting_and_until_beats_stop() -> None:
    clock = Clock()
    beat = Heartbeat(CollectorRegistry(), stall_after_s=60, clock=clock)
    assert beat.alive() and not beat.ready()
    beat.beat()
    assert beat.alive() and beat.ready()
    beat.beat(ok=False)  # a store outage: alive, not ready
    assert beat.alive() and not beat.ready()
    beat.beat()
    clock.now += 61
    assert not beat.alive() and not beat.ready()


def test_probes_and_metrics_served_on_the_metrics_port() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    beat = Heartbeat(registry, stall_after_s=60, clock=clock)
    server = serve(registry, "127.0.0.1", 0, beat)
    assert server is not None
    port = server.server_address[1]
    try:
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/readyz")[0] == 503
        beat.beat()
        assert get(port, "/readyz")[0] == 200
        status, body = get(port, "/metrics")
        assert status == 200 and b"kd_loop_heartbeat_timestamp_seconds" in body
        clock.now += 61  # the loop stopped beating: the port still answers, the probe fails
        assert get(port, "/healthz")[0] == 503
        assert get(port, "/readyz")[0] == 503
        assert get(port, "/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_no_port_serves_nothing() -> None:
    assert serve(CollectorRegistry(), "127.0.0.1", None) is None


async def test_keygen_loop_beats(settings: Settings, sync: SyncRecord) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    stop = asyncio.Event()
    keygen = Keygen.on_postgres(settings, cold, sync, stop, Generator(1))
    running = asyncio.ensure_future(keygen.run())
    try:
        for _ in range(600):  # deadline: 30 s
            if keygen.heartbeat.ready():
                break
            await asyncio.sleep(0.05)
        assert keygen.heartbeat.ready()
        assert keygen.metrics.fence.halted._value.get() == 0
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await cold.close()


async def test_keysync_loop_beats(settings: Settings, sync: SyncRecord, hot: HotStore) -> None:
    cold = await ColdStore.connect(settings.postgres_dsn)
    wake = WakeChannel(hot.endpoint, hot.namespace)
    stop = asyncio.Event()
    heartbeat = Heartbeat(CollectorRegistry())
    keysync = Keysync(settings, GuardedCold(cold, sync, build_id_types(settings)), hot)
    running = asyncio.ensure_future(run(keysync, wake, settings, stop, heartbeat.beat))
    try:
        for _ in range(600):  # deadline: 30 s
            if heartbeat.ready():
                break
            await asyncio.sleep(0.05)
        assert heartbeat.ready()
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await cold.close()
