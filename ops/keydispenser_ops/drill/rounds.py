"""One fault round, as both drills (Sentinel and Cluster) record and report it.

A round's own figures (which primary before and after, what the fault measured) go in
``figures`` and show inline in its JSON row; the fields here are what every round has.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from keydispenser_ops.drill.load import RecordingLoad


@dataclass
class Round:
    """One fault and what followed it."""

    number: int
    fault: str
    began: float  # monotonic
    ended: float
    wall: float  # unix seconds at the fault
    error: str | None  # the fault could not be injected as planned
    keys_discarded: int
    figures: dict[str, Any] = field(default_factory=dict)
    process_exits: list[str] = field(default_factory=list)
    outage_began_ms: int = 0
    resume_ms: int = 0
    served_after_fault: int = 0
    # After a fault that gave Redis a new primary: did it own the fence (None: no such
    # fault, or the topology reports it in its figures).
    fence_engaged: bool | None = None
    # From when the Redis data the fault may destroy was written (monotonic): the oldest
    # ledger entry not applied when it began, or the snapshot it restarted from.
    loss_from: float = 0.0

    def row(self) -> dict[str, Any]:
        """The round as the JSON report shows it (the fault's figures inline)."""
        fields = asdict(self)
        figures = fields.pop("figures")
        for private in ("began", "ended", "wall", "loss_from"):
            fields.pop(private)
        at = time.strftime("%H:%M:%S", time.gmtime(self.wall)) + f".{int(self.wall % 1 * 1000):03d}"
        return {"round": fields.pop("number"), "fault_at": at, **fields, **figures}


def measure_disruptions(rounds: list[Round], load: RecordingLoad) -> None:
    """Outage figures per round, from every request the load made (after the drill):
    when refusals began and how long until keys were served again, and how many were
    served from the fault's end to the next round."""
    for i, done in enumerate(rounds):
        until = rounds[i + 1].began if i + 1 < len(rounds) else float("inf")
        began, resume = load.disruption(done.began, until)
        done.outage_began_ms, done.resume_ms = round(began), round(resume)
        done.served_after_fault = load.served_between(done.ended, until)
