"""The outcome of a status change a client waits for (MOSIP's PUT): decided once by
keysync in the ledger transaction that applies it, written beside it and published to
the dispenser that answers (docs/reliability.md, "The ledger's one history")."""

from __future__ import annotations

from typing import Final

from shared.domain.tiers import KeyStatus

ASSIGNED: Final = "assigned"  # marked used now, or asked again by its client
UNASSIGNED: Final = "unassigned"  # given back (never issued again)
UNUSED: Final = "unused"  # given back, to be issued again (reissue_released)
NOT_ISSUED: Final = "not_issued"  # not ISSUED any more (used, or given back)
NOT_FOUND: Final = "not_found"  # never issued, or issued to another client
# A release refused: the key is quarantined (an operator accepted a lost history that
# may have changed it; docs/operations.md, "KdLedgerHalted").
QUARANTINED: Final = "quarantined"
ALL: Final = frozenset({ASSIGNED, UNASSIGNED, UNUSED, NOT_ISSUED, NOT_FOUND, QUARANTINED})


def outcome_of(op: str, client: str, admin: bool, found: KeyStatus) -> str:
    """What a status change comes to, from its key's status once the change is applied
    (MOSIP's rules: only an ISSUED UIN changes status; asking for the status it has
    already is answered as the first time; a key issued to another client is, to a
    client without ledger permission, a key never issued). ``op``: "used" or
    "release"."""
    if found.state == "unknown" or (found.client != client and not admin):
        return NOT_FOUND
    if found.state == "quarantined" and op == "release":
        return QUARANTINED
    wanted = "assigned" if op == "used" else "released"
    if found.state != wanted:
        return NOT_ISSUED
    if wanted == "assigned":
        return ASSIGNED
    return UNUSED if found.reissued else UNASSIGNED
