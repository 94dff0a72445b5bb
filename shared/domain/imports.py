"""What an import reads from another generator, and what it makes of each row (pure).

An import (``keydispenser import``) excludes every ID it sees, whatever its status where
it came from: none is ever handed out by keydispenser. A status says more only for a
type with a ledger: an ID its source handed out becomes an issue of the ledger (used,
when the source says it was assigned), so that lookups and status changes answer for
it as the source would have.

The statuses are the sources' own, as their code writes them:

- OpenG2P's ID Generator (``id_pool_<type>``): AVAILABLE, TAKEN.
- MOSIP's kernel (``kernel.uin``, ``kernel.uin_assigned``): UNUSED, then ISSUED when
  handed out, ASSIGNED once its client confirmed it (a PUT UNASSIGNED of an ISSUED UIN
  sets it back to UNUSED). ``kernel.vid``/``kernel.vid_assigned``: AVAILABLE, then
  ASSIGNED when handed out, EXPIRED past its expiry.
- A file: one ID a line, optionally followed by one of the statuses above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from shared.domain.idtypes import IdType


@dataclass(frozen=True)
class Meaning:
    """What a source's status says of an ID: handed out (``issued``), and confirmed by
    its client (``used``)."""

    issued: bool
    used: bool = False


FREE: Final = Meaning(issued=False)
ISSUED: Final = Meaning(issued=True)
ASSIGNED: Final = Meaning(issued=True, used=True)

# Each source's statuses and their meaning.
OPENG2P: Final = {"AVAILABLE": FREE, "TAKEN": ISSUED}
MOSIP_UIN: Final = {"UNUSED": FREE, "ISSUED": ISSUED, "ASSIGNED": ASSIGNED}
MOSIP_VID: Final = {"AVAILABLE": FREE, "ASSIGNED": ISSUED, "EXPIRED": ISSUED}
# A file's: every source's, ASSIGNED as MOSIP's UINs mean it (confirmed by its client).
FILE: Final = {**MOSIP_VID, **OPENG2P, **MOSIP_UIN}
EXAMPLES: Final = 5  # invalid IDs (and unknown statuses) shown by example
# A dispenser hands out keys of its stock (keys popped ahead of requests) only within
# this long of having read the type's stock epoch unchanged (a read issued then): an
# import bumps the epoch after it swept the hot list, and returns once this long has
# passed (when a dispenser held a stock in that time), so no key popped before the sweep
# is handed out from a stock after the import returned.
STOCK_FRESH_S: Final = 2.0


@dataclass(frozen=True)
class SourceRow:
    """One row of a source: the ID as written there, its status and its times."""

    value: str
    status: str | None
    created_at: datetime | None = None
    updated_at: datetime | None = None


# A row as staged for the set-based statements (sql.IMPORT_STAGING_COLUMNS' order): key,
# counter, status, created_at, updated_at, issued, used.
Staged = tuple[str, int | None, str, datetime | None, datetime | None, bool, bool]


@dataclass
class Intake:
    """Checks a source's rows for one type, a chunk at a time, and keeps count: IDs that
    cannot be keys of the type (not staged), statuses the source does not have."""

    id_type: IdType
    statuses: dict[str, Meaning]
    rows: int = 0
    invalid: int = 0
    invalid_examples: list[str] = field(default_factory=list)
    unknown: Counter[str] = field(default_factory=Counter)

    @classmethod
    def resumed(
        cls, id_type: IdType, statuses: dict[str, Meaning], counts: Mapping[str, Any]
    ) -> Intake:
        """An intake that goes on from ``counts`` (a killed run's, as ``counts`` made them)."""
        return cls(
            id_type,
            statuses,
            rows=int(counts["rows"]),
            invalid=int(counts["invalid"]),
            invalid_examples=list(counts["invalid_examples"]),
            unknown=Counter(counts["unknown"]),
        )

    def counts(self) -> dict[str, Any]:
        """What it counted so far (JSON: a killed run is resumed from it)."""
        return {
            "rows": self.rows,
            "invalid": self.invalid,
            "invalid_examples": list(self.invalid_examples),
            "unknown": dict(self.unknown),
        }

    def take(self, rows: list[SourceRow]) -> list[Staged]:
        """The rows of ``rows`` to stage, each with its key as the stores hold it and the
        counter keygen makes it from."""
        self.rows += len(rows)
        keys = self.id_type.keys_of([row.value for row in rows])
        kept: list[tuple[str, SourceRow, Meaning]] = []
        for row, key in zip(rows, keys, strict=True):
            meaning = self._meaning(row.status)
            if key is None:
                self._invalid(row.value)
            elif meaning is not None:
                kept.append((key, row, meaning))
        counters = self.id_type.counters_of([key for key, _, _ in kept])
        return [
            (key, counter, _status(row), *_times(row), m.issued, m.used)
            for (key, row, m), counter in zip(kept, counters, strict=True)
        ]

    def _meaning(self, status: str | None) -> Meaning | None:
        meaning = None if status is None else self.statuses.get(_spelled(status))
        if meaning is None:
            self.unknown[repr(status)] += 1
        return meaning

    def _invalid(self, value: str) -> None:
        """An ID that cannot be one of the type's keys (length, alphabet, check digit,
        affixes, filters): counted, and shown by example."""
        self.invalid += 1
        if len(self.invalid_examples) < EXAMPLES:
            self.invalid_examples.append(value)

    def refusal(self) -> str | None:
        """Why the import is refused (statuses its source does not have), if it is."""
        if not self.unknown:
            return None
        known = ", ".join(self.statuses)
        found = ", ".join(f"{s} ({n} rows)" for s, n in self.unknown.most_common(EXAMPLES))
        return f"statuses this source does not have: {found}; known: {known}"


def _status(row: SourceRow) -> str:
    return _spelled(row.status or "")


@cache
def _spelled(status: str) -> str:
    """A status as the tables above write it (a source may pad or lower-case it)."""
    return status.strip().upper()


def _times(row: SourceRow) -> tuple[datetime | None, datetime | None]:
    return _utc(row.created_at), _utc(row.updated_at)


def _utc(moment: datetime | None) -> datetime | None:
    """A source's time; one without a zone is UTC (MOSIP writes UTC times)."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def file_row(line: str, status: str) -> SourceRow | None:
    """A line of an import file: an ID, then optionally a status (after a comma, a tab or
    spaces); ``status`` when it has none. None for a blank line or a comment (#)."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    for separator in (",", "\t", " "):
        if separator in text:
            value, _, given = text.partition(separator)
            return SourceRow(value.strip(), given.strip() or status)
    return SourceRow(text, status)
