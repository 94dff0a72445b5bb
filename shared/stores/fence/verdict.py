"""The PostgreSQL fence's verdict: what ``settle`` does on a server, judged from its
locked clock row and the record Redis keeps. Pure: no driver, no I/O (the dispenser's
ledger lookups judge a server by it too, and import nothing of the fence's procedure).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from shared.domain.tiers import column as _column
from shared.stores.fence.sync_record import Record


@dataclass(frozen=True)
class ClockRow:
    """The sync clock row as locked by the fence, and the server's current timeline."""

    timeline: int
    fork: int
    clock: int
    here: int
    database: str = ""
    fences: int = 0

    heads: dict[str, str] = field(default_factory=dict)  # lane -> newest ledger link
    restore_to: dict[str, str] = field(default_factory=dict)  # lane -> link to restore to

    @classmethod
    def of(cls, row: Any) -> ClockRow:
        """From LOCK_SYNC_CLOCK's row (or any row with its columns)."""
        heads, restore_to = _column(row, "heads"), _column(row, "restore_to")
        return cls(
            int(row["timeline"]),
            int(row["fork"]),
            int(row["clock"]),
            int(row["here"]),
            str(row["database"]),
            int(row["fences"]),
            json.loads(heads) if heads else {},
            json.loads(restore_to) if restore_to else {},
        )

    def history_start(self) -> int:
        """The clock value this server's history covers on its current timeline."""
        return self.clock if self.timeline != self.here else self.fork


def verdict(row: ClockRow, record: Record) -> str:
    """What ``settle`` does on this server: 'ok', 'vouch', 'behind', 'superseded',
    'foreign' or 'halt' (module docstring).

    The same rule as the SQL guard, with the record read under the row lock. A record
    Redis lost (untrusted: what a replica had; or none) only bounds the truth from
    below: it can prove a server behind or superseded, never prove it current.
    """
    if record.database and row.database and record.database != row.database:
        return "foreign"
    if not record.needs_vouch:
        return _judge(row, record, lower_bound=False)
    found = _judge(row, record, lower_bound=True) if record.timeline else "ok"
    if found == "superseded":
        return found
    # Behind what Redis still knows, or proven behind by a stamp, or forked since its
    # last guarded write: the leases Redis lost may be above anything it can name.
    if found == "behind" or record.fence_needed or row.timeline not in (0, row.here):
        return "halt"
    return "vouch"


def _judge(row: ClockRow, record: Record, *, lower_bound: bool) -> str:
    if row.here == record.timeline:
        if row.history_start() == record.fork:
            return "ok" if row.clock >= record.clock else "behind"
        # Another history on the same timeline number: a second server promoted to it,
        # or this one from before a fence whose claim the record holds. A lower bound
        # only says this history must have started after everything it recorded.
        if lower_bound and row.history_start() >= record.clock:
            return "ok"
        return "behind"
    if row.here > record.timeline:
        return "ok" if row.history_start() >= record.clock else "behind"
    return "superseded"


def combined(verdicts: list[str], records: list[Record]) -> str:
    """What ``settle`` does over every group's record, given each one's verdict
    ('foreign' and 'superseded' were refused already): 'halt' if any halts; a fence
    ('operator', 'behind', 'stamp') if any needs one, unless another record must be
    vouched for ('halt': the leases that group lost may be above anything it can
    name; an operator's fence claims them all regardless); else 'vouch' if any must
    be; else 'ok'. With one record this is that record's verdict."""
    verdicts = ["ok" if v == "confirm" else v for v in verdicts]
    if "halt" in verdicts:
        return "halt"
    fence = next((v for v in ("operator", "behind", "stamp") if v in verdicts), None)
    if fence is not None:
        if fence != "operator" and any(record.needs_vouch for record in records):
            return "halt"
        return fence
    return "vouch" if "vouch" in verdicts else "ok"
