"""The drill's checker, on the whole history rather than on counters (after Jepsen's):
every key clients received and marked used, against the ledger PostgreSQL holds, and
the time the service refused to work rather than risk a duplicate.

A ledger record may be lost only with data a fault destroyed by definition, and only
for a type that keeps the default ``ledger_durability`` (async): entries a Redis primary
held, not yet applied, when it died, was cut off or restarted without persistence (or
entries made after the snapshot a restart went back to). Each such record is charged
to its fault by its exact time (``LossSpan``: from the oldest entry the stream had not
applied when the fault began, or from the snapshot, to the fault's end), never by a
window around it: a record is charged to a fault when the request that made it was under
way during that span (its entry was written between the request and its answer), and
counted apart (``lost_to_fault``); any other missing record is
``ledger_missing`` or ``ledger_used_missing`` and fails the drill. PostgreSQL faults
excuse nothing: keysync applies the entries a promotion lost again.
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

from keydispenser_ops.drill.fault_kinds import DATA_LOSS_FAULTS
from shared.stores.postgres import sql

LEDGER_SETTLE_S = 30.0  # how long the checker waits for keysync to drain the ledger


@dataclass(frozen=True)
class LossSpan:
    """What a fault could destroy (monotonic seconds): records issued from ``start``
    (the oldest entry the stream had not applied when the fault began, or the snapshot
    a restart went back to, if earlier than the fault) to ``end`` (the fault over)."""

    fault: str
    start: float
    end: float

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end

    def may_hold(self, sent: float, answered: float) -> bool:
        """Whether a record written by a request sent at ``sent`` and answered at
        ``answered`` may have been made within the span: its entry was written at some
        instant between the two (a slow answer arrives long after its entry was made)."""
        return sent <= self.end and answered >= self.start


def loss_spans(rounds: list[tuple[str, float, float, dict[str, Any]]]) -> list[LossSpan]:
    """(fault, start, ended, figures) of each round (``start``: from where the fault
    could destroy records) -> the spans of those that destroy Redis data (a pause only
    when it stopped the Redis primary)."""
    return [
        LossSpan(fault, start, ended)
        for fault, start, ended, figures in rounds
        if fault in DATA_LOSS_FAULTS
        and (fault != "pause" or figures.get("paused") == "redis_primary")
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
    spans: list[LossSpan],
    duplicate_alarms: int,
    requested: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The ledger against what clients were given (``received``: key -> when answered;
    ``requested``: when that request was sent, monotonic seconds) and marked used
    (``marked``: key -> when the mark was accepted)."""
    lost: dict[str, int] = {}
    sent = requested or {}

    def destroyed(at: float, since: float | None = None) -> bool:
        """Whether a record made between ``since`` and ``at`` (a request's life) may
        have fallen with data a fault destroyed (the latest such fault takes the count)."""
        found = [span for span in spans if span.may_hold(at if since is None else since, at)]
        if not found:
            return False
        fault = max(found, key=lambda span: span.start).fault
        lost[fault] = lost.get(fault, 0) + 1
        return True

    missing = [
        k for k, at in received.items() if k not in recorded and not destroyed(at, sent.get(k))
    ]
    used_missing = [
        k
        for k, at in marked.items()
        if not recorded.get(k, False)
        and not destroyed(at)
        and not destroyed(received[k], sent.get(k))
    ]
    return {
        "rows": len(recorded),
        "missing": len(missing),
        "used_missing": len(used_missing),
        "missing_sample": sorted(missing)[:10],
        "used_missing_sample": sorted(used_missing)[:10],
        "lost_to_fault": lost,
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


def sum_of(logs: Path, event: str, figure: str) -> int:
    """The sum of a whole-number ``figure`` over every log line of ``event`` (every
    process's), e.g. the ledger links keysync restored after PostgreSQL fences."""
    return sum(
        int(found.get(figure) or 0)
        for path in logs.glob("*.log")
        for found in _events(path)
        if found.get("event") == event
    )
