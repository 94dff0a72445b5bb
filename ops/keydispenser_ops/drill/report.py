"""What every drill reports and checks, whatever its topology (Sentinel or Cluster): one
report, its fields found in one place (``common_fields``), one checker. Each topology's
report adds its own figures and checks.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from keydispenser_ops.drill import history, lifecycle
from keydispenser_ops.drill.lifecycle import LifecycleLoad
from keydispenser_ops.drill.load import RecordingLoad
from keydispenser_ops.drill.rounds import Round


@dataclass(frozen=True)
class Report:
    """The figures every drill has (field names are the JSON report's): ``ledger`` is
    history.check_ledger's, ``lifecycle`` lifecycle.check's."""

    kind: ClassVar[str]  # the JSON report's "drill"

    faults: list[dict[str, Any]]  # one row per round (rounds.Round.row)
    keys_dispensed: int
    unique_keys: int
    duplicates: int
    requests: int
    errors: dict[str, int]
    faults_not_injected: int
    ledger: dict[str, Any]
    lifecycle: dict[str, Any]
    process_exits: list[str]
    # Rounds whose Redis fault left no new primary owning the fence, or after which no
    # key was handed out: either fails the drill.
    fence_not_engaged: list[int]
    not_resumed: list[int]
    fault_kinds: list[str]

    def common_checks(self) -> list[tuple[bool, str]]:
        """What every drill must hold, each check named once: (holds, what to say when
        it does not)."""
        duplicates, ledger, uins = self.duplicates, self.ledger, self.lifecycle
        process_exits, fence_not_engaged = self.process_exits, self.fence_not_engaged
        not_resumed = self.not_resumed
        left = ledger.get("unapplied_at_end", 0)  # -1: the stream could not be read
        return [
            (duplicates == 0, f"{duplicates} keys dispensed twice"),
            (ledger["missing"] == 0, f"{ledger['missing']} ledger records lost"),
            (ledger["used_missing"] == 0, f"{ledger['used_missing']} accepted use marks lost"),
            (ledger["duplicate_alarms"] == 0, "the ledger raised its duplicate alarm"),
            # Entries still in the stream when the fleet stopped would count as records lost.
            (left == 0, f"keysync left {left} ledger entries unapplied at the end"),
            (
                uins.get("keys_in_two_hands", 0) == 0,
                f"{uins.get('keys_in_two_hands')} keys live in two hands",
            ),
            (
                uins.get("status_changes_lost", 0) == 0,
                f"{uins.get('status_changes_lost')} status changes lost",
            ),
            (
                uins.get("ledger_wrong_client", 0) == 0,
                f"{uins.get('ledger_wrong_client')} under another client",
            ),
            (
                uins.get("ledger_missing", 0) == 0,
                f"{uins.get('ledger_missing')} lifecycle records lost",
            ),
            (
                uins.get("replays_of_keys_reissued", 0) == 0,
                "a retry was answered with a key given back and issued to another client",
            ),
            # The ledger's one history: a pair of PUTs at once is decided once (never
            # both applied), and an acknowledged PUT ASSIGNED asked again is answered so.
            (
                uins.get("put_pairs_both_applied", 0) == 0,
                f"{uins.get('put_pairs_both_applied')} PUT pairs answered applied both",
            ),
            (
                uins.get("repeats_contradicted", 0) == 0,
                f"{uins.get('repeats_contradicted')} acknowledged PUTs answered otherwise later",
            ),
            (uins.get("uins_received", 0) > 0, "the lifecycle received no UIN"),
            (not process_exits, f"processes exited: {process_exits}"),
            (not fence_not_engaged, f"fence did not engage: {fence_not_engaged}"),
            (not not_resumed, f"no key after rounds {not_resumed}"),
            # A fault that could not be injected proved nothing of its round.
            (self.faults_not_injected == 0, f"{self.faults_not_injected} faults not injected"),
        ]

    def own_checks(self) -> list[tuple[bool, str]]:
        """What this topology's drill checks besides (none here)."""
        return []

    def failures(self) -> list[str]:
        """Every broken check named: empty when every check held (the CLI fails on any)."""
        checks = [*self.common_checks(), *self.own_checks()]
        return [failure for holds, failure in checks if not holds]

    def fields(self) -> dict[str, Any]:
        """The report's own fields as the JSON file shows them."""
        return asdict(self)

    def as_json(self) -> dict[str, Any]:
        return {
            "drill": self.kind,
            "rounds": len(self.faults),
            **self.fields(),
            "verdict": self.failures(),
        }


async def common_fields(
    rounds: list[Round],
    load: RecordingLoad,
    uins: LifecycleLoad,
    *,
    kinds: list[str],
    dsn: str,
    logs: Path,
    exits: list[str],
    unapplied: int,
    fence_rounds: list[Round],
) -> dict[str, Any]:
    """``Report``'s fields as a drill finds them after its rounds: the load's figures, the
    ledger and the lifecycle checked against PostgreSQL, the processes that exited.
    ``fence_rounds``: the rounds after which Redis's new primary must own the fence;
    ``unapplied``: the ledger entries keysync left when the fleet stopped."""
    rows = [done.row() for done in rounds]
    # What a fault destroys: the Redis data written since its round's ``loss_from``
    # (each record charged by its time, up to the fault's end).
    spans = history.loss_spans([(r.fault, r.loss_from, r.ended, r.figures) for r in rounds])
    recorded = await history.ledger_rows(dsn, load.name)
    alarms = await asyncio.to_thread(history.duplicate_alarms, logs)
    ledger = history.check_ledger(
        recorded, load.received_at, load.marked, spans, alarms, load.requested_at
    )
    ledger["unapplied_at_end"] = unapplied
    return {
        "faults": rows,
        "keys_dispensed": load.dispensed,
        "unique_keys": len(load.keys),
        "duplicates": load.duplicates,
        "requests": load.requests,
        "errors": dict(load.errors),
        "faults_not_injected": sum(1 for row in rows if row["error"]),
        "ledger": ledger,
        "lifecycle": lifecycle.check(uins, await lifecycle.ledger_issues(dsn), spans),
        "process_exits": exits,
        "fence_not_engaged": [
            done.number for done in fence_rounds if not done.error and not done.fence_engaged
        ],
        "not_resumed": [done.number for done in rounds if not done.served_after_fault],
        "fault_kinds": kinds,
    }
