"""keysync's Prometheus metrics (one registry per process, built in main)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.metrics import TYPE, FenceMetrics


class KeysyncMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.moved = Counter("kd_keys_moved", "Keys moved cold -> hot", TYPE, registry=registry)
        self.refill_rate = Gauge(
            "kd_refill_rate", "Keys/s pushed to a hot list, recent window", TYPE, registry=registry
        )
        self.ledger_issued = Counter(
            "kd_ledger_issued", "Issued keys written to the ledger", registry=registry
        )
        self.ledger_used = Counter(
            "kd_ledger_used", "Keys marked used in the ledger", registry=registry
        )
        self.ledger_used_unknown = Counter(
            "kd_ledger_used_unknown",
            "Keys marked used before the ledger saw them issued (the mark waits for the issue)",
            registry=registry,
        )
        self.ledger_marks_expired = Counter(
            "kd_ledger_marks_expired",
            "Used marks forgotten after waiting ledger_early_mark_ttl_s for their issue",
            registry=registry,
        )
        self.ledger_used_refused = Counter(
            "kd_ledger_used_refused",
            "Keys marked used by a client they were not issued to (not applied)",
            registry=registry,
        )
        self.ledger_restored = Counter(
            "kd_ledger_restored_links",
            "Ledger transactions a PostgreSQL promotion lost, written again from the ledger log",
            registry=registry,
        )
        self.ledger_halted = Gauge(
            "kd_ledger_halted",
            "1 while the ledger is halted: ledger history lost (a PostgreSQL promotion lost "
            "what the ledger log cannot restore); runbook: docs/operations.md, KdLedgerHalted",
            registry=registry,
        )
        self.ledger_duplicates = Counter(
            "kd_ledger_duplicates",
            "Keys the ledger saw issued twice (must stay 0)",
            TYPE,
            registry=registry,
        )
        self.ledger_backlog = Gauge(
            "kd_ledger_backlog", "Ledger stream entries not yet in PostgreSQL", registry=registry
        )
        self.fence = FenceMetrics(registry)
