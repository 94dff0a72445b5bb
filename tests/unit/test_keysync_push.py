"""keysync's push policy: a batch lands on at most one server, at most once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import cast

import pytest

from keysync.main import Keysync
from shared import runtime
from shared.domain.config import Settings
from shared.domain.errors import StoreUnavailable
from shared.domain.idtypes import IdType, build_id_types
from shared.domain.ports import OpenBatch
from shared.domain.tiers import NO_STAMP, Depth, Pushed, SequenceState, Stamp


class ServerEpochs:
    """Two server epochs; ``current`` answers. Can lose a reply after executing, or
    answer with a refusal of the batch's stamp."""

    def __init__(self) -> None:
        self.lists: dict[str, list[str]] = {"A": [], "B": []}
        self.markers: dict[str, set[str]] = {"A": set(), "B": set()}
        self.current = "A"
        # per call: ok | lose_reply | down | switch_to_B | a stamp refusal (untrusted...)
        self.script: list[str] = []
        self.now_ms = 1_000_000
        self.deadlines: list[int] = []

    async def server_time_ms(self) -> int:
        return self.now_ms

    async def observe(self, name: str) -> Depth:
        return Depth(len(self.lists[self.current]), self.current)

    async def record_refill(self, name: str, rate: float, at: float) -> None:
        pass

    async def mark_exhausted(self, name: str) -> None:
        pass

    async def push(
        self,
        name: str,
        keys: Sequence[str],
        batch_id: str,
        pin: str = "",
        stamp: Stamp = NO_STAMP,
        not_after_ms: int = 0,
        marker_ttl_s: float = 3600,
        epoch: int = 0,
    ) -> Pushed:
        self.deadlines.append(not_after_ms)
        step = self.script.pop(0) if self.script else "ok"
        if step in ("untrusted", "stale", "expired", "foreign"):
            return Pushed(len(self.lists[self.current]), self.current, step)
        if step == "down":
            raise StoreUnavailable("redis", "connection refused")
        if step == "switch_to_B":
            self.current = "B"
        server = self.current
        if pin and pin != server:
            return Pushed(len(self.lists[server]), server, "refused")
        if batch_id in self.markers[server]:
            return Pushed(len(self.lists[server]), server, "duplicate")
        self.markers[server].add(batch_id)
        self.lists[server].extend(keys)
        if step == "lose_reply":
            raise StoreUnavailable("redis", "connection reset while reading")
        return Pushed(len(self.lists[server]), server, "pushed")


class NoCold:
    """push() never reads the cold tier; it only asks it to vouch for a lost record."""

    vouches = 0

    async def vouch(self) -> None:
        self.vouches += 1

    async def begin_take(self, name: str, size: int) -> OpenBatch:
        raise AssertionError("not expected")

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        raise AssertionError("not expected")

    async def wake_keygen(self, name: str) -> None:
        raise AssertionError("not expected")

    epoch = 0  # the import epoch PostgreSQL holds now

    async def import_epoch(self, name: str) -> int:
        return self.epoch


def keysync(servers: ServerEpochs, token: str = "A", push_retry_s: float = 10.0) -> Keysync:
    settings = Settings.model_validate({"id_types": {}, "keysync": {"push_retry_s": push_retry_s}})
    sync = Keysync(settings, NoCold(), servers)
    sync._token = token
    return sync


async def test_plain_push() -> None:
    servers = ServerEpochs()
    assert await keysync(servers).push("t", ["k1", "k2"]) == 2
    assert servers.lists == {"A": ["k1", "k2"], "B": []}


async def test_stale_pin_is_refused_then_repinned() -> None:
    servers = ServerEpochs()
    servers.current = "B"
    assert await keysync(servers, token="A").push("t", ["k"]) == 1
    assert servers.lists == {"A": [], "B": ["k"]}


async def test_a_batch_taken_before_an_import_is_lost_when_the_primary_changed() -> None:
    """The new primary may lack the epoch the import set on the old one: PostgreSQL's
    epoch, read again, says the batch is older than an import."""
    servers = ServerEpochs()
    sync = keysync(servers, token="old")
    cast(NoCold, sync._cold).epoch = 3
    with pytest.raises(StoreUnavailable, match="taken_before_an_import"):
        await sync.push("t", ["k1", "k2"], epoch=2)
    assert servers.lists["A"] == []
    assert await sync.push("t", ["k3"], epoch=3) == 1  # taken after it: pushed


async def test_lost_reply_then_retry_on_the_same_server_adds_nothing() -> None:
    servers = ServerEpochs()
    servers.script = ["lose_reply", "down", "ok"]
    assert await keysync(servers).push("t", ["k1", "k2"]) == 2
    assert servers.lists["A"] == ["k1", "k2"]


async def test_lost_reply_then_failover_loses_the_batch_but_never_doubles_it() -> None:
    servers = ServerEpochs()
    servers.script = ["lose_reply", "switch_to_B"]
    with pytest.raises(StoreUnavailable, match="lost"):
        await keysync(servers).push("t", ["k1"])
    assert servers.lists == {"A": ["k1"], "B": []}


async def test_unreachable_until_the_deadline_loses_the_batch() -> None:
    servers = ServerEpochs()
    servers.script = ["down"] * 100
    with pytest.raises(StoreUnavailable, match="unreachable"):
        await keysync(servers, push_retry_s=0.2).push("t", ["k1"])
    assert servers.lists == {"A": [], "B": []}


async def test_every_attempt_carries_one_deadline_on_the_servers_clock() -> None:
    """The deadline comes from the server's TIME before the first attempt, and stays."""
    servers = ServerEpochs()
    servers.script = ["lose_reply", "down", "ok"]
    assert await keysync(servers, push_retry_s=2.5).push("t", ["k1"]) == 1
    assert servers.deadlines == [servers.now_ms + 2_500] * 3


async def test_a_push_past_its_deadline_is_lost_never_pushed() -> None:
    servers = ServerEpochs()
    servers.script = ["expired"]
    with pytest.raises(StoreUnavailable, match="push_deadline_passed"):
        await keysync(servers).push("t", ["k1"])
    assert servers.lists == {"A": [], "B": []}


async def test_a_record_redis_lost_is_rebuilt_then_the_batch_is_pushed() -> None:
    servers = ServerEpochs()
    servers.script = ["untrusted", "ok"]
    sync = keysync(servers)
    assert await sync.push("t", ["k1"]) == 1
    assert sync._cold.vouches == 1  # type: ignore[attr-defined]
    assert servers.lists["A"] == ["k1"]


@pytest.mark.parametrize("refusal", ["stale", "foreign"])
async def test_a_refused_stamp_loses_the_batch(refusal: str) -> None:
    servers = ServerEpochs()
    servers.script = [refusal]
    with pytest.raises(StoreUnavailable, match="lost"):
        await keysync(servers).push("t", ["k1"])
    assert servers.lists == {"A": [], "B": []}


async def test_a_keysync_frozen_during_its_back_off_never_retries_past_its_deadline() -> None:
    """SIGSTOP (or a VM pause) between two attempts of an ambiguous push: once resumed,
    its deadline has passed, and the marker that made a retry harmless may have
    expired: the batch is lost, never pushed a second time."""
    servers = ServerEpochs()
    servers.script = ["lose_reply"]
    sync = keysync(servers)
    now = [100.0]
    sync.clock = lambda: now[0]

    async def frozen(seconds: float) -> None:
        now[0] += 7_200  # two hours pass; the marker expires meanwhile
        servers.markers["A"].clear()

    sync.sleep = frozen
    with pytest.raises(StoreUnavailable, match="unreachable"):
        await sync.push("t", ["k1"])
    assert servers.lists["A"] == ["k1"]


class Killed(BaseException):
    """The process died at a fault point."""


async def test_killed_between_push_attempts_leaves_the_batch_once_on_its_server() -> None:
    """An ambiguous attempt executed, then keysync died before retrying: the batch sits
    on the pinned server exactly once (the retry that never came could only duplicate)."""
    servers = ServerEpochs()
    servers.script = ["lose_reply"]

    def fault(point: str) -> None:
        if point == "keysync.push_retry":
            raise Killed(point)

    sync = keysync(servers)
    sync._fault = fault
    with pytest.raises(Killed):
        await sync.push("t", ["k1", "k2"])
    assert servers.lists == {"A": ["k1", "k2"], "B": []}


def test_fault_points_are_inert_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.delenv(runtime.FAULT_POINT_ENV, raising=False)
    assert runtime.fault_points_from_environ() is runtime.no_fault
    monkeypatch.setenv(runtime.FAULT_POINT_ENV, "keysync.committed")
    hook = runtime.fault_points_from_environ()
    hook("keysync.push_retry")
    assert exits == []
    hook("keysync.committed")
    assert exits == [137]


class Batch:
    """A batch whose transaction is open until commit or rollback."""

    def __init__(self, keys: list[str], log: list[str]) -> None:
        self.keys, self.stamp, self._log = keys, NO_STAMP, log
        self.epoch = 0

    async def commit(self) -> None:
        self._log.append(f"commit {self.keys[0]}")

    async def rollback(self) -> None:
        self._log.append(f"rollback {self.keys[0]}")


class Cold(NoCold):
    """Hands out batches of ``size`` keys named by a counter, logging each step."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.taken = 0

    async def begin_take(self, name: str, size: int) -> OpenBatch:
        self.taken += 1
        self.log.append(f"take b{self.taken}")
        return Batch([f"b{self.taken}-{n}" for n in range(size)], self.log)


class SlowPushes(ServerEpochs):
    def __init__(self, delay_s: float, log: list[str]) -> None:
        super().__init__()
        self.delay_s, self.log = delay_s, log

    async def push(
        self,
        name: str,
        keys: Sequence[str],
        batch_id: str,
        pin: str = "",
        stamp: Stamp = NO_STAMP,
        not_after_ms: int = 0,
        marker_ttl_s: float = 3600,
        epoch: int = 0,
    ) -> Pushed:
        await asyncio.sleep(self.delay_s)
        pushed = await super().push(name, keys, batch_id, pin, stamp, not_after_ms)
        self.log.append(f"pushed {keys[0]}")
        return pushed


def pipelined(servers: ServerEpochs, cold: Cold) -> tuple[Keysync, IdType]:
    config = {"kind": "numeric", "length": 10, "sync_batch": 2, "hot": {"low": 5, "high": 6}}
    settings = Settings.model_validate({"id_types": {"t": config}})
    return Keysync(settings, cold, servers), build_id_types(settings, generating=False)["t"]


async def test_each_batch_commits_only_after_the_one_before_was_pushed() -> None:
    cold = Cold()
    servers = SlowPushes(0.0, cold.log)
    sync, id_type = pipelined(servers, cold)
    assert await sync.refill(id_type) == 6
    assert cold.log == [
        "take b1", "commit b1-0",
        "take b2", "pushed b1-0", "commit b2-0",  # b2 deleted during b1's push
        "take b3", "pushed b2-0", "commit b3-0",
        "pushed b3-0",
    ]  # fmt: skip
    assert servers.lists["A"] == [f"b{b}-{n}" for b in (1, 2, 3) for n in (0, 1)]


async def test_a_push_slower_than_the_hold_rolls_the_next_batch_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The open transaction holds the sync clock's row: it never waits long on Redis."""
    monkeypatch.setattr("keysync.main.NEXT_BATCH_HOLD_S", 0.01)
    cold = Cold()
    servers = SlowPushes(0.05, cold.log)
    sync, id_type = pipelined(servers, cold)
    assert await sync.refill(id_type) == 6
    assert cold.log[:5] == ["take b1", "commit b1-0", "take b2", "rollback b2-0", "pushed b1-0"]
    assert "commit b2-0" not in cold.log
    assert len(servers.lists["A"]) == 6 and len(set(servers.lists["A"])) == 6


class Empty:
    keys: list[str] = []
    stamp = NO_STAMP
    epoch = 0

    async def commit(self) -> None:
        pass

    async def rollback(self) -> None:
        pass


class Drying(Cold):
    """Empty for the takes listed in ``empty`` (1-based), else batches as Cold."""

    def __init__(self, empty: set[int]) -> None:
        super().__init__()
        self.empty, self.woken = empty, 0

    async def begin_take(self, name: str, size: int) -> OpenBatch:
        batch = await super().begin_take(name, size)
        return Empty() if self.taken in self.empty else batch

    async def sequence_state(self, id_type: IdType) -> SequenceState:
        return SequenceState(leased_counters=0, domain=10**9)

    async def wake_keygen(self, name: str) -> None:
        self.woken += 1


async def test_cold_empty_is_warned_once_per_spell_while_keygen_is_woken_every_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cold = Drying(empty={1, 2, 3, 7})
    servers = SlowPushes(0.0, cold.log)
    sync, id_type = pipelined(servers, cold)
    for _ in range(3):  # a first start: keygen has made nothing yet, polled three times
        assert await sync.refill(id_type) == 0
    servers.lists["A"].clear()
    assert await sync.refill(id_type) == 6  # takes 4, 5, 6: refilled
    servers.lists["A"].clear()
    await sync.refill(id_type)  # take 7 is empty again: a new spell
    warned = [r for r in caplog.records if r.getMessage() == "cold_empty"]
    assert len(warned) == 2 and cold.woken == 4
