"""Snowflake IDs: layout, text, validation, and the minter each dispenser process runs.

An ID is one non-negative 63-bit integer: milliseconds since the type's epoch, then the
machine ID the process leased, then a sequence within the millisecond. Its text is the
decimal number, or 11 Base62 characters (zero-padded, so text order is numeric order).

The minter is pure: it reads an injected clock (milliseconds since 1970) and a lease
(``Lease``, the machine-ID lease's read side) and hands out contiguous ranges of IDs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from shared.domain.config import Settings, SnowflakeConfig
from shared.domain.config.id_types import SNOWFLAKE_BITS
from shared.domain.errors import (
    ClockBehind,
    InvalidInput,
    MachineIdUnavailable,
    SnowflakeTimeExhausted,
)
from shared.domain.formats.base62 import ALPHABET as BASE62_ALPHABET
from shared.domain.formats.text import radix_columns, to_strings
from shared.domain.idtypes import MAX_INPUT

Clock = Callable[[], int]
BASE62_WIDTH = 11  # 62**11 > 2**63
DECIMAL_WIDTH = len(str((1 << SNOWFLAKE_BITS) - 1))
_BASE62_VALUE = {c: i for i, c in enumerate(BASE62_ALPHABET)}
_BASE62_BYTES = np.frombuffer(BASE62_ALPHABET.encode(), dtype=np.uint8)
# Longer waits than these for a clock that does not move on are refused (ClockBehind).
_WAIT_SLACK_MS = 100


def wall_clock_ms() -> int:
    """The system's wall clock in milliseconds since 1970 (it may step backwards)."""
    return time.time_ns() // 1_000_000


class Lease(Protocol):
    """What the minter needs of a machine-ID lease (``shared.leases.holder.MachineLease``)."""

    @property
    def pool(self) -> str: ...
    @property
    def machine_id(self) -> int: ...
    @property
    def floor_ms(self) -> int: ...  # mint strictly above this (earlier holders' last time)
    @property
    def lost(self) -> asyncio.Event: ...
    def valid(self) -> bool: ...
    def ceiling_ms(self) -> int: ...  # never mint above this
    def note_issued(self, ms: int) -> None: ...


@dataclass(frozen=True)
class Parts:
    """A decoded ID: its time (ms since 1970), machine ID and sequence."""

    time_ms: int
    machine: int
    sequence: int

    def as_dict(self) -> dict[str, Any]:
        when = datetime.fromtimestamp(self.time_ms / 1000, UTC)
        iso = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.time_ms % 1000:03d}Z"
        return {
            "time": iso,
            "time_ms": self.time_ms,
            "machine": self.machine,
            "sequence": self.sequence,
        }


class Layout:
    """Where each field sits in the 63 bits, and the text of an ID."""

    def __init__(self, config: SnowflakeConfig) -> None:
        self.epoch_ms = config.epoch
        self.time_bits = config.bits.time
        self.machine_bits = config.bits.machine
        self.sequence_bits = config.bits.sequence
        self.text = config.text
        self.sequence_limit = 1 << self.sequence_bits
        self.machine_shift = self.sequence_bits
        self.time_shift = self.sequence_bits + self.machine_bits
        self.time_limit = 1 << self.time_bits

    def compose(self, time_ms: int, machine: int, sequence: int) -> int:
        """The ID of ``sequence`` minted by ``machine`` at ``time_ms`` (ms since 1970)."""
        return (
            ((time_ms - self.epoch_ms) << self.time_shift)
            | (machine << self.machine_shift)
            | sequence
        )

    def decompose(self, value: int) -> Parts:
        return Parts(
            time_ms=(value >> self.time_shift) + self.epoch_ms,
            machine=(value >> self.machine_shift) & ((1 << self.machine_bits) - 1),
            sequence=value & (self.sequence_limit - 1),
        )

    def encode(self, value: int) -> str:
        if self.text == "decimal":
            return str(value)
        chars = []
        for _ in range(BASE62_WIDTH):
            value, digit = divmod(value, 62)
            chars.append(BASE62_ALPHABET[digit])
        return "".join(reversed(chars))

    def encode_ranges(self, ranges: Iterable[range]) -> list[str]:
        """The text of every ID in ``ranges``, in order."""
        if self.text == "decimal":
            return [str(value) for span in ranges for value in span]
        values = np.concatenate(
            [np.arange(span.start, span.stop, dtype=np.uint64) for span in ranges]
            or [np.empty(0, dtype=np.uint64)]
        )
        return to_strings(_BASE62_BYTES[radix_columns(values, BASE62_WIDTH, 62)])

    def parse(self, text: str) -> int | None:
        """The ID ``text`` is the canonical text of; None when it is none (wrong length,
        leading zeros, out of 63 bits). InvalidInput when it cannot be one at all."""
        if not text or len(text) > MAX_INPUT:
            raise InvalidInput(f"id_value must be 1..{MAX_INPUT} characters")
        if self.text == "decimal":
            if not (text.isascii() and text.isdigit()):
                raise InvalidInput("id_value must use the decimal alphabet")
            if len(text) > DECIMAL_WIDTH or (text[0] == "0" and text != "0"):
                return None
            value = int(text)
        else:
            if not set(text) <= _BASE62_VALUE.keys():
                raise InvalidInput("id_value must use the base62 alphabet")
            if len(text) != BASE62_WIDTH:
                return None
            value = 0
            for char in text:
                value = value * 62 + _BASE62_VALUE[char]
        return value if value < 1 << SNOWFLAKE_BITS else None


class SnowflakeType:
    """A snowflake ID type: validates and decodes its IDs; the minter makes them."""

    def __init__(self, name: str, config: SnowflakeConfig) -> None:
        self.name = name
        self.config = config
        self.layout = Layout(config)
        self.pool = config.pool(name)
        self.machine_range = config.machine_range

    def validate(self, value: str) -> bool:
        """True for the canonical text of an ID whose machine ID is in the type's range."""
        parsed = self.layout.parse(value)
        if parsed is None:
            return False
        lo, hi = self.machine_range
        return lo <= self.layout.decompose(parsed).machine <= hi

    def decode(self, value: str) -> Parts:
        """Time, machine and sequence of an ID; InvalidInput when ``value`` is none."""
        parsed = self.layout.parse(value)
        if parsed is None:
            raise InvalidInput(f"'{value}' is not the {self.config.text} text of a {self.name} ID")
        return self.layout.decompose(parsed)


def build_snowflake_types(settings: Settings) -> dict[str, SnowflakeType]:
    return {
        name: SnowflakeType(name, cfg)
        for name, cfg in settings.id_types.items()
        if isinstance(cfg, SnowflakeConfig)
    }


class Minter:
    """Strictly increasing IDs of one type in one process, from the lease it holds.

    Never mints at or below the lease's floor (the time recorded by earlier holders of
    the machine ID) nor above its ceiling, nor while the lease cannot be proven alive. A
    full millisecond waits for the next; a clock behind the last time issued is waited
    for up to ``max_backwards_ms`` and refused beyond.
    """

    def __init__(self, id_type: SnowflakeType, clock: Clock = wall_clock_ms) -> None:
        self.name = id_type.name
        self.layout = id_type.layout
        self.max_backwards_ms = id_type.config.max_backwards_ms
        self._clock = clock
        self._lease: Lease | None = None
        self._machine_part = 0
        self._last_ms = -1  # the time of the last ID issued, or the floor
        self._next_sequence = self.layout.sequence_limit

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def last_ms(self) -> int:
        return self._last_ms

    def attach(self, lease: Lease) -> None:
        """Mint from ``lease`` from now on, strictly after its floor and after every ID
        this minter already issued (under any machine ID)."""
        self._lease = lease
        self._machine_part = lease.machine_id << self.layout.machine_shift
        self._last_ms = max(self._last_ms, lease.floor_ms)
        self._next_sequence = self.layout.sequence_limit  # nothing more at _last_ms

    def detach(self) -> None:
        self._lease = None

    def mint_some(self, count: int) -> range | int:
        """Up to ``count`` IDs of one millisecond, or how many ms to wait before asking
        again. Raises MachineIdUnavailable, ClockBehind or SnowflakeTimeExhausted."""
        lease = self._lease
        if lease is None or not lease.valid():
            raise MachineIdUnavailable(self.name, "lease not held")
        now, last = self._clock(), self._last_ms
        if now == last:
            if self._next_sequence < self.layout.sequence_limit:
                return self._take(lease, now, self._next_sequence, count)
            return 1  # this millisecond is full
        if now < last:
            if last - now > self.max_backwards_ms:
                raise ClockBehind(self.name, last - now, self.max_backwards_ms)
            return last - now
        if now > lease.ceiling_ms():
            if now - lease.ceiling_ms() > self.max_backwards_ms:
                raise MachineIdUnavailable(self.name, "lease record behind the clock")
            return 1
        return self._take(lease, now, 0, count)

    def _take(self, lease: Lease, now: int, sequence: int, count: int) -> range:
        relative = now - self.layout.epoch_ms
        if relative >= self.layout.time_limit:
            raise SnowflakeTimeExhausted(self.name)
        if relative < 0:
            raise ClockBehind(self.name, -relative, self.max_backwards_ms)
        taken = min(count, self.layout.sequence_limit - sequence)
        base = (relative << self.layout.time_shift) | self._machine_part
        self._last_ms, self._next_sequence = now, sequence + taken
        lease.note_issued(now)
        return range(base + sequence, base + sequence + taken)

    def _budget_ms(self, count: int) -> int:
        return self.max_backwards_ms + -(-count // self.layout.sequence_limit) + _WAIT_SLACK_MS

    def mint(self, count: int, sleep: Callable[[float], None] = time.sleep) -> list[range]:
        """``count`` IDs in increasing ranges, waiting (a bounded time) when needed."""
        spans: list[range] = []
        deadline = time.monotonic() + self._budget_ms(count) / 1000
        while count > 0:
            got = self.mint_some(count)
            if isinstance(got, range):
                spans.append(got)
                count -= len(got)
                continue
            self._before_deadline(deadline, got)
            sleep(got / 1000)
        return spans

    async def amint(self, count: int) -> list[range]:
        """``mint`` for an event loop: waits without blocking it."""
        spans: list[range] = []
        deadline = time.monotonic() + self._budget_ms(count) / 1000
        while count > 0:
            got = self.mint_some(count)
            if isinstance(got, range):
                spans.append(got)
                count -= len(got)
                continue
            self._before_deadline(deadline, got)
            await asyncio.sleep(got / 1000)
        return spans

    def _before_deadline(self, deadline: float, wait_ms: int) -> None:
        if time.monotonic() + wait_ms / 1000 > deadline:
            behind = max(0, self._last_ms - self._clock())
            raise ClockBehind(self.name, behind, self.max_backwards_ms)
