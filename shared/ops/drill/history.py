"""The drill's checker, on the whole history rather than on counters (after Jepsen's):
every key clients received and marked used, against the ledger PostgreSQL holds, and
the time the service refused to work rather than risk a duplicate.

A ledger record may be lost only with data a fault destroyed: entries a Redis primary
had not replicated when it died (or was cut off, or restarted without persistence),
rows a PostgreSQL primary had not replicated when a replica was promoted. Those are
counted per fault (``ledger_lost_with_data``); any other missing record is
``ledger_missing`` or ``ledger_used_missing`` and fails the drill.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from shared.stores import sql

LEDGER_SETTLE_S = 30.0  # how long the checker waits for keysync to drain the ledger
# Faults that destroy data a record may sit in (unreplicated Redis writes, a Redis
# restarted without persistence, unreplicated PostgreSQL commits).
DATA_LOSS_FAULTS = frozenset(
    {
        "primary_sigkill",
        "cut_links_then_sigkill",
        "restart_from_old_snapshot",
        "sentinel_failover",
        "failback",
        "partition",
        "redis_restart_empty",
        "pause",  # of a primary (``paused``: redis_primary, postgres_primary) only
        "postgres_failover",
        "postgres_split_brain",
        # redis cluster drill (cluster.py): a shard's unreplicated writes, or its data
        "shard_primary_sigkill",
        "lagging_replica_failover",
        "shard_restart_empty",
    }
)
# A record issued this long before such a fault may still sit unreplicated or undrained.
LOSS_LEAD_S = 5.0
LOSS_TAIL_S = 5.0  # ... or this long after it ended (clients retrying, keysync catching up)


PAUSED_PRIMARIES = frozenset({"redis_primary", "postgres_primary"})


@dataclass(frozen=True)
class Window:
    """A fault that could destroy records: when it ran (monotonic time)."""

    fault: str
    began: float
    ended: float

    def holds(self, at: float) -> bool:
        return self.began - LOSS_LEAD_S <= at <= self.ended + LOSS_TAIL_S

    def distance(self, at: float) -> float:
        """How far ``at`` is from the fault itself (0 while it ran)."""
        return max(self.began - at, at - self.ended, 0.0)


def loss_windows(rounds: list[tuple[str, float, float, dict[str, Any]]]) -> list[Window]:
    """(fault, began, ended, figures) of each round -> the windows of those that lose
    data (a pause only when it stopped a primary)."""
    return [
        Window(fault, began, ended)
        for fault, began, ended, figures in rounds
        if fault in DATA_LOSS_FAULTS
        and (fault != "pause" or figures.get("paused") in PAUSED_PRIMARIES)
    ]


async def ledger_rows(dsn: str, name: str) -> dict[str, bool]:
    """key -> used, once keysync stopped adding rows (or LEDGER_SETTLE_S passed)."""
    ledger = sql.ledger_table(name)
    conn = await asyncpg.connect(dsn)
    try:
        rows, stable_since = -1, time.monotonic()
        deadline = time.monotonic() + LEDGER_SETTLE_S
        while time.monotonic() < deadline and time.monotonic() - stable_since < 3:
            marked = f"SELECT count(*) + count(used_at) FROM {ledger}"
            now = int(await conn.fetchval(marked))
            if now != rows:
                rows, stable_since = now, time.monotonic()
            await asyncio.sleep(0.5)
        found = await conn.fetch(f"SELECT key, used_at IS NOT NULL AS used FROM {ledger}")
    finally:
        await conn.close()
    return {r["key"]: bool(r["used"]) for r in found}


def check_ledger(
    recorded: dict[str, bool],
    received: dict[str, float],
    marked: dict[str, float],
    windows: list[Window],
    duplicate_alarms: int,
) -> dict[str, Any]:
    """The ledger against what clients were given (``received``: key -> when) and
    marked used (``marked``: key -> when the mark was accepted)."""
    lost: dict[str, int] = {}
    # per fault: seconds from its window's start to when the first few lost keys came
    seen_at: dict[str, list[float]] = {}

    def explained(at: float) -> bool:
        """Whether a record issued at ``at`` fell to a fault (the nearest that can
        explain it takes the count)."""
        near = [w for w in windows if w.holds(at)]
        if not near:
            return False
        window = min(near, key=lambda w: w.distance(at))
        lost[window.fault] = lost.get(window.fault, 0) + 1
        offsets = seen_at.setdefault(window.fault, [])
        if len(offsets) < 5:
            offsets.append(round(at - window.began, 3))
        return True

    missing = [k for k, at in received.items() if k not in recorded and not explained(at)]
    used_missing = [
        k
        for k, at in marked.items()
        if not recorded.get(k, False) and not explained(at) and not explained(received[k])
    ]
    return {
        "rows": len(recorded),
        "missing": len(missing),
        "used_missing": len(used_missing),
        "missing_sample": sorted(missing)[:10],
        "used_missing_sample": sorted(used_missing)[:10],
        "lost_with_data": lost,
        # seconds after its fault began (negative: before) that a few of them were issued
        "lost_with_data_at_s": seen_at,
        "marked": len(marked),
        "unreceived": len(recorded.keys() - received.keys()),
        "duplicate_alarms": duplicate_alarms,
    }


def _events(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                continue  # a line cut by a SIGKILL


def duplicate_alarms(logs: Path) -> int:
    """How often keysync logged the ledger's duplicate alarm (keysync logs JSON lines)."""
    return sum(
        path.read_text(errors="replace").count('"duplicate_key_issued"')
        for path in logs.glob("keysync*.log")
    )


def fail_closed_seconds(logs: Path) -> dict[str, float]:
    """Seconds keygen and keysync refused to lease or sync on the PostgreSQL fence's
    word (superseded, halted, behind, a range fenced), per process: from each
    ``store_unavailable`` of store ``postgres_fence`` to its ``store_recovered``."""
    spent: dict[str, float] = {}
    for path in sorted([*logs.glob("keygen*.log"), *logs.glob("keysync*.log")]):
        began: float | None = None
        total = 0.0
        for event in _events(path):
            if event.get("store") != "postgres_fence":
                continue
            at = _seconds(str(event.get("ts", "")))
            if event.get("event") == "store_unavailable" and began is None:
                began = at
            elif event.get("event") == "store_recovered" and began is not None:
                total += max(at - began, 0.0)
                began = None
        spent[path.stem] = round(total, 3)
    return spent


def _seconds(stamp: str) -> float:
    """A log line's ``ts`` (ISO 8601, UTC, milliseconds) as unix seconds."""
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def count_events(logs: Path, event: str) -> int:
    """How many log lines of every process have ``event``."""
    needle = f'"event": "{event}"'
    return sum(path.read_text(errors="replace").count(needle) for path in logs.glob("*.log"))
