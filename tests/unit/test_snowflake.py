"""Snowflake layout, text and the minter, on a fake lease and a stepped clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.config import Settings, SnowflakeConfig, load_settings
from shared.domain.config.id_types import SNOWFLAKE_EPOCH_MS
from shared.domain.errors import (
    ClockBehind,
    ConfigError,
    InvalidInput,
    MachineIdUnavailable,
    SnowflakeTimeExhausted,
)
from shared.domain.idtypes import build_id_types
from shared.domain.snowflake import (
    BASE62_WIDTH,
    Layout,
    Minter,
    SnowflakeType,
    build_snowflake_types,
)
from tests.conftest import EMPTY_CONFIG

T0 = SNOWFLAKE_EPOCH_MS + 200_000_000_000  # some day in 2026


def config(**values: Any) -> SnowflakeConfig:
    return SnowflakeConfig.model_validate({"kind": "snowflake", **values})


class FakeLease:
    def __init__(self, machine_id: int = 7, floor_ms: int = 0, ceiling: int = 2**62) -> None:
        self.pool = "events"
        self.machine_id = machine_id
        self.floor_ms = floor_ms
        self.lost = asyncio.Event()
        self.ceiling = ceiling
        self.issued = -1

    def valid(self) -> bool:
        return not self.lost.is_set()

    def ceiling_ms(self) -> int:
        return self.ceiling

    def note_issued(self, ms: int) -> None:
        self.issued = ms


class SteppedClock:
    """A clock that moves only when told to (and by ``tick`` ms on every sleep)."""

    def __init__(self, now: int = T0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(1, round(seconds * 1000))


def minter(clock: SteppedClock, lease: FakeLease | None = None, **values: Any) -> Minter:
    made = Minter(SnowflakeType("events", config(**values)), clock)
    made.attach(lease or FakeLease())
    return made


def ids(spans: list[range]) -> list[int]:
    return [value for span in spans for value in span]


# --- configuration


def test_defaults_and_epoch_forms() -> None:
    assert config().epoch == SNOWFLAKE_EPOCH_MS
    assert config(epoch="2020-01-01").epoch == SNOWFLAKE_EPOCH_MS
    assert config(epoch="2020-01-01T01:00:00+01:00").epoch == SNOWFLAKE_EPOCH_MS
    assert config(epoch=1234).epoch == 1234
    assert config().machine_range == (0, 1023)
    assert config(bits={"time": 41, "machine": 8, "sequence": 14}).machine_range == (0, 255)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"bits": {"time": 41, "machine": 10, "sequence": 13}}, "id_types.t.bits"),
        ({"epoch": "yesterday"}, "id_types.t.epoch"),
        ({"text": "hex"}, "id_types.t.text"),
        ({"machine_ids": {"max": 1024}}, "machine_ids.max"),
        ({"machine_ids": {"pool": "Bad Pool"}}, "id_types.t.machine_ids.pool"),
        ({"length": 10}, "id_types.t.length"),
        ({"bits": {"time": 33, "machine": 20, "sequence": 10}}, "more than 4096 IDs"),
        ({"lease_ttl_s": 2, "lease_renew_s": 1}, "a third of lease_ttl_s"),
        ({"machine_ids": {"min": 9, "max": 3}}, "machine_ids.min"),
        ({"epoch": "2999-01-01"}, "in the future"),
    ],
)
def test_bad_snowflake_config_names_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(EMPTY_CONFIG, id_types={"t": {"kind": "snowflake", **values}})
    assert field in str(caught.value)


def test_pooled_types_leave_snowflake_types_out() -> None:
    settings: Settings = load_settings(
        EMPTY_CONFIG,
        id_types={"ev": {"kind": "snowflake"}, "farmer": {"kind": "numeric", "length": 10}},
    )
    assert list(build_id_types(settings, generating=False)) == ["farmer"]
    assert list(build_snowflake_types(settings)) == ["ev"]
    with pytest.raises(ConfigError, match=r"id_types\.ev"):
        settings.pooled("ev")
    only_snowflake = load_settings(EMPTY_CONFIG, id_types={"ev": {"kind": "snowflake"}})
    assert build_id_types(only_snowflake) == {}  # no permutation key needed


# --- layout and text

LAYOUTS = st.sampled_from([(41, 10, 12), (41, 8, 14), (39, 8, 16), (44, 5, 14), (30, 12, 21)]).map(
    lambda b: {"time": b[0], "machine": b[1], "sequence": b[2]}
)


@given(
    bits=LAYOUTS,
    text=st.sampled_from(["decimal", "base62"]),
    data=st.data(),
)
def test_compose_decode_and_text_round_trip(
    bits: dict[str, int], text: str, data: st.DataObject
) -> None:
    snowflake = SnowflakeType("t", config(bits=bits, text=text, epoch=0))
    layout = snowflake.layout
    when = data.draw(st.integers(0, (1 << bits["time"]) - 1))
    machine = data.draw(st.integers(0, (1 << bits["machine"]) - 1))
    sequence = data.draw(st.integers(0, (1 << bits["sequence"]) - 1))
    value = layout.compose(when, machine, sequence)
    assert 0 <= value < 1 << 63
    parts = layout.decompose(value)
    assert (parts.time_ms, parts.machine, parts.sequence) == (when, machine, sequence)
    encoded = layout.encode(value)
    assert layout.parse(encoded) == value
    assert layout.encode_ranges([range(value, value + 1)]) == [encoded]
    assert snowflake.validate(encoded)
    assert snowflake.decode(encoded) == parts


@given(st.lists(st.integers(0, (1 << 63) - 1), min_size=2, max_size=20))
def test_base62_text_sorts_as_the_numbers_do(values: list[int]) -> None:
    layout = Layout(config(text="base62"))
    texts = [layout.encode(v) for v in values]
    assert all(len(t) == BASE62_WIDTH for t in texts)
    assert sorted(texts) == [layout.encode(v) for v in sorted(values)]


def test_encode_ranges_matches_encode() -> None:
    for text in ("decimal", "base62"):
        layout = Layout(config(text=text))
        spans = [range(5, 9), range(10**15, 10**15 + 3), range(2**63 - 2, 2**63)]
        assert layout.encode_ranges(spans) == [layout.encode(v) for s in spans for v in s]
    assert Layout(config(text="base62")).encode_ranges([]) == []


def test_validate_and_decode_refuse_what_is_not_an_id() -> None:
    decimal = SnowflakeType("t", config(machine_ids={"min": 2, "max": 5}))
    inside = decimal.layout.encode(decimal.layout.compose(T0, 3, 9))
    outside = decimal.layout.encode(decimal.layout.compose(T0, 6, 9))
    assert decimal.validate(inside) and not decimal.validate(outside)
    assert decimal.decode(outside).machine == 6  # decodes any well-formed ID
    for not_canonical in ("0" + inside, str(2**63), "9" * 20):
        assert not decimal.validate(not_canonical)
        with pytest.raises(InvalidInput):
            decimal.decode(not_canonical)
    for malformed in ("12a", "-1", "", "1" * 257):
        with pytest.raises(InvalidInput):
            decimal.validate(malformed)
    base62 = SnowflakeType("t", config(text="base62"))
    assert not base62.validate("abc")
    assert not base62.validate("zzzzzzzzzzz")  # above 2**63
    with pytest.raises(InvalidInput):
        base62.validate("abc-def")


def test_decoded_time_is_iso_and_ms() -> None:
    snowflake = SnowflakeType("t", config())
    value = snowflake.layout.encode(snowflake.layout.compose(SNOWFLAKE_EPOCH_MS + 1_234, 7, 3))
    assert snowflake.decode(value).as_dict() == {
        "time": "2020-01-01T00:00:01.234Z",
        "time_ms": SNOWFLAKE_EPOCH_MS + 1_234,
        "machine": 7,
        "sequence": 3,
    }


# --- the minter


def test_ids_increase_within_and_across_milliseconds() -> None:
    clock = SteppedClock()
    made = minter(clock)
    first = ids(made.mint(3, clock.sleep))
    clock.now += 1
    second = ids(made.mint(2, clock.sleep))
    minted = first + second
    assert minted == sorted(set(minted))
    assert [made.layout.decompose(v).sequence for v in minted] == [0, 1, 2, 0, 1]
    assert {made.layout.decompose(v).machine for v in minted} == {7}
    assert made.lease is not None and made.lease.floor_ms == 0


def test_a_full_millisecond_waits_for_the_next() -> None:
    clock = SteppedClock()
    made = minter(clock, bits={"time": 41, "machine": 20, "sequence": 2}, machine_ids={"max": 15})
    minted = ids(made.mint(10, clock.sleep))
    assert minted == sorted(set(minted)) and len(minted) == 10
    times = [made.layout.decompose(v).time_ms for v in minted]
    assert times == [T0] * 4 + [T0 + 1] * 4 + [T0 + 2] * 2
    assert clock.slept == [0.001, 0.001]
    assert made.mint_some(5) == range(minted[-1] + 1, minted[-1] + 3)  # the rest of T0 + 2
    assert made.mint_some(1) == 1  # full: wait 1 ms


def test_a_clock_slightly_behind_is_waited_for() -> None:
    clock = SteppedClock()
    made = minter(clock, max_backwards_ms=5)
    before = ids(made.mint(1, clock.sleep))
    clock.now -= 4
    after = ids(made.mint(1, clock.sleep))
    assert after[0] > before[0]
    assert sum(clock.slept) == pytest.approx(0.004)


def test_a_clock_far_behind_is_refused_until_it_catches_up() -> None:
    clock = SteppedClock()
    made = minter(clock, max_backwards_ms=5)
    before = ids(made.mint(1, clock.sleep))
    clock.now -= 6
    with pytest.raises(ClockBehind) as caught:
        made.mint(1, clock.sleep)
    assert caught.value.behind_ms == 6 and not clock.slept
    clock.now += 7
    assert ids(made.mint(1, clock.sleep))[0] > before[0]


def test_never_at_or_below_the_floor() -> None:
    clock = SteppedClock()
    made = minter(clock, FakeLease(floor_ms=T0), max_backwards_ms=5)
    first = ids(made.mint(1, clock.sleep))[0]
    assert made.layout.decompose(first).time_ms == T0 + 1  # strictly above, after 1 ms
    far = minter(SteppedClock(), FakeLease(floor_ms=T0 + 50), max_backwards_ms=5)
    with pytest.raises(ClockBehind):
        far.mint(1)


def test_never_above_the_ceiling() -> None:
    clock = SteppedClock()
    lease = FakeLease(ceiling=T0 - 3)
    made = minter(clock, lease, max_backwards_ms=5)
    with pytest.raises(MachineIdUnavailable):
        made.mint(1, clock.sleep)  # waits 3 ms for the ceiling, which does not move
    lease.ceiling = T0 + 10
    got = ids(made.mint(1, clock.sleep))
    assert made.layout.decompose(got[0]).time_ms <= lease.ceiling
    assert lease.issued == made.last_ms
    far = minter(SteppedClock(), FakeLease(ceiling=T0 - 6), max_backwards_ms=5)
    with pytest.raises(MachineIdUnavailable, match="behind the clock"):
        far.mint(1)


def test_an_invalid_or_missing_lease_mints_nothing() -> None:
    clock = SteppedClock()
    lease = FakeLease()
    made = minter(clock, lease)
    made.mint(1)
    lease.lost.set()
    with pytest.raises(MachineIdUnavailable):
        made.mint(1)
    made.detach()
    with pytest.raises(MachineIdUnavailable):
        made.mint_some(1)


def test_a_new_lease_continues_strictly_after_the_last_id() -> None:
    clock = SteppedClock()
    made = minter(clock, FakeLease(machine_id=900))
    before = ids(made.mint(3, clock.sleep))
    made.attach(FakeLease(machine_id=1, floor_ms=T0 - 1_000))
    after = ids(made.mint(3, clock.sleep))
    assert after[0] > before[-1]  # a smaller machine ID, a later millisecond


def test_time_field_full_is_exhaustion_and_before_epoch_refused() -> None:
    clock = SteppedClock(now=2**30 + 5)
    made = minter(clock, bits={"time": 30, "machine": 12, "sequence": 21}, epoch=0)
    with pytest.raises(SnowflakeTimeExhausted):
        made.mint(1)
    early = minter(SteppedClock(now=T0 - 1_000), epoch=T0)  # a clock before the epoch
    with pytest.raises(ClockBehind):
        early.mint(1)


def test_a_stopped_clock_is_refused_after_a_bounded_wait() -> None:
    clock = SteppedClock()
    made = minter(clock, bits={"time": 41, "machine": 20, "sequence": 2}, machine_ids={"max": 15})
    made.mint(4, clock.sleep)
    with pytest.raises(ClockBehind):
        made.mint(1, lambda seconds: None)  # the clock never moves on


async def test_amint_waits_without_blocking() -> None:
    clock = SteppedClock()
    made = minter(clock, bits={"time": 41, "machine": 20, "sequence": 2}, machine_ids={"max": 15})
    made.mint(4, clock.sleep)

    async def tick() -> None:
        await asyncio.sleep(0)
        clock.now += 1

    ticker = asyncio.create_task(tick())
    got = ids(await made.amint(2))
    await ticker
    assert [made.layout.decompose(v).time_ms for v in got] == [T0 + 1] * 2


def test_batches_are_ranges_not_loops() -> None:
    clock = SteppedClock()
    made = minter(clock, bits={"time": 41, "machine": 8, "sequence": 14})
    spans = made.mint(5_000, clock.sleep)
    assert [len(s) for s in spans] == [5_000]
