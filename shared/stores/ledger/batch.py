"""A batch of ledger entries as read from the Redis stream (``parse``), and what a
ledger transaction wrote (``Applied``).

Parsing decides nothing: it groups a batch's entries by type and kind (issues, marks of
use, releases, the status changes a client waits for), drops repeats of one entry, and
keeps each entry's stream time. The decisions are ``decide.py``'s; writing again what
a transaction wrote, after a PostgreSQL promotion, is ``replay.py``'s.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.domain.apikeys import ANONYMOUS
from shared.domain.idtypes import IdType
from shared.stores.ledger.stream import LedgerEntry

log = logging.getLogger(__name__)


def entry_time(entry_id: str) -> datetime:
    """A stream entry ID starts with the Redis server's clock in milliseconds."""
    return datetime.fromtimestamp(int(entry_id.split("-", 1)[0]) / 1000, UTC)


@dataclass
class Issued:
    """Issue entries of one type, one item per entry (as ledger_sql._ISSUE_BATCH takes them)."""

    keys: list[str] = field(default_factory=list)  # each entry's keys, space-separated
    times: list[datetime] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)  # one per key, or one for all
    idempotency_keys: list[str | None] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    count: int = 0  # keys in all

    def arrays(self) -> tuple[list[str], list[datetime], list[str], list[str | None], list[str]]:
        return self.keys, self.times, self.clients, self.idempotency_keys, self.entries

    def issues(self) -> list[str]:
        """Each issue of a key as ``"<entry> <key>"`` (as SELECT_NOT_INSERTED names
        the ones not inserted)."""
        return [
            f"{e} {k}" for e, ks in zip(self.entries, self.keys, strict=True) for k in ks.split()
        ]


@dataclass
class Used:
    keys: list[str] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)  # who marked each key
    admin: list[bool] = field(default_factory=list)  # whether it may mark any key
    entries: list[str] = field(default_factory=list)  # the stream entry of each mark


@dataclass(frozen=True)
class Reply:
    """A status change a client waits for the outcome of (``reply`` in its entry)."""

    entry: str
    op: str  # "used" or "release"
    key: str
    client: str
    admin: bool


@dataclass
class Batch:
    issued: dict[str, Issued] = field(default_factory=lambda: defaultdict(Issued))
    used: dict[str, Used] = field(default_factory=lambda: defaultdict(Used))
    released: dict[str, Used] = field(default_factory=lambda: defaultdict(Used))
    reissue: set[str] = field(default_factory=set)  # types whose released keys go back
    replies: dict[str, list[Reply]] = field(default_factory=lambda: defaultdict(list))
    duplicates: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    skipped: int = 0


def parse(entries: list[LedgerEntry], types: dict[str, IdType]) -> Batch:
    """Group stream entries by type and operation; flag keys an entry lists twice.

    A key issued by two entries of one batch is left to the decision: the earlier entry
    may be one applied again whose issue was released since, the key given out anew by
    the later (a Redis failover brought the earlier back unacknowledged), and only the
    ledger knows (``decide._issue``: INSERT_LEDGER_ISSUED, SELECT_ISSUED_TWICE)."""
    batch = Batch()
    for entry_id, fields in entries:
        name, op = fields.get("type", ""), fields.get("op", "")
        id_type = types.get(name)
        keys = fields.get("keys", "").split()
        if id_type is None or not id_type.config.ledger or op not in ("issue", "used", "release"):
            batch.skipped += 1
            log.warning("ledger_entry_skipped", extra={"entry": entry_id, "id_type": name})
            continue
        if op in ("used", "release"):
            _add_mark(batch, name, op, entry_id, fields, keys, id_type)
            continue
        _add_issue(batch, name, entry_id, fields, keys)
    return batch


def _add_mark(
    batch: Batch,
    name: str,
    op: str,
    entry_id: str,
    fields: dict[str, str],
    keys: list[str],
    id_type: IdType,
) -> None:
    used = batch.used[name] if op == "used" else batch.released[name]
    if op == "release" and id_type.config.reissue_released:
        batch.reissue.add(name)
    client, admin = fields.get("clients") or ANONYMOUS, fields.get("admin") == "1"
    if fields.get("reply") == "1" and len(keys) == 1:
        batch.replies[name].append(Reply(entry_id, op, keys[0], client, admin))
    used.keys.extend(keys)
    used.times.extend([entry_time(entry_id)] * len(keys))
    used.clients.extend([client] * len(keys))
    used.admin.extend([admin] * len(keys))
    used.entries.extend([entry_id] * len(keys))


def _add_issue(
    batch: Batch,
    name: str,
    entry_id: str,
    fields: dict[str, str],
    keys: list[str],
) -> None:
    clients = fields.get("clients") or ANONYMOUS
    if len(set(keys)) != len(keys):
        keys, clients = _without_repeats(keys, clients, batch.duplicates[name])
    if not keys:
        return
    issued = batch.issued[name]
    issued.keys.append(" ".join(keys))
    issued.times.append(entry_time(entry_id))
    issued.clients.append(clients)
    issued.idempotency_keys.append(fields.get("idem") or None)
    issued.entries.append(entry_id)
    issued.count += len(keys)


def _without_repeats(keys: list[str], clients: str, repeats: list[str]) -> tuple[list[str], str]:
    """An entry's keys less those it lists twice (added to ``repeats``), with their
    clients (one per key, or one for all)."""
    names = clients.split() or [ANONYMOUS]
    if len(names) != len(keys):
        names = [names[0]] * len(keys)
    kept, kept_names, mine = [], [], set()
    for key, client in zip(keys, names, strict=True):
        if key in mine:
            repeats.append(key)
            continue
        mine.add(key)
        kept.append(key)
        kept_names.append(client)
    return kept, " ".join(kept_names)


@dataclass
class Applied:
    issued: int = 0
    used: int = 0
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    used_unknown: int = 0  # marks of keys not (yet) issued: they wait for their issue row
    used_refused: int = 0  # marks by a client the key was not issued to (not applied)
    released: int = 0  # keys given back (and put back in the cold tier when reissued)
    restored: int = 0  # ledger links a restore wrote again after a PostgreSQL fence
    # What the transaction wrote, in order, as ``apply_ops`` writes it again (the log).
    ops: list[dict[str, Any]] = field(default_factory=list)
    # The outcome of each status change a client waits for: entry -> OUTCOMES.
    outcomes: dict[str, str] = field(default_factory=dict)
