"""Prometheus metrics, one registry per process (built in its main, passed down)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

TYPE = ["id_type"]


class KeygenMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.counters_headroom = Gauge(
            "kd_keyspace_counters_headroom", "Counters never leased", TYPE, registry=registry
        )
        self.headroom_ratio = Gauge(
            "kd_keyspace_headroom_ratio",
            "Share of the counter domain never leased",
            TYPE,
            registry=registry,
        )
        self.keys_left = Gauge(
            "kd_keyspace_estimated_keys_left",
            "Counters left x measured acceptance rate",
            TYPE,
            registry=registry,
        )
        self.exhaustion_eta = Gauge(
            "kd_keyspace_exhaustion_eta_seconds",
            "Forecast time to exhaustion at the recent leasing rate (-1: unknown)",
            TYPE,
            registry=registry,
        )
        self.cold_depth = Gauge(
            "kd_cold_depth", "Cold keys (capped count)", TYPE, registry=registry
        )
        self.ranges = Counter("kd_ranges_leased", "Ranges leased", TYPE, registry=registry)
        self.candidates = Counter("kd_candidates", "Counters generated", TYPE, registry=registry)
        self.keys = Counter(
            "kd_keys_generated", "Keys committed to the cold table", TYPE, registry=registry
        )
        self.exhausted = Gauge(
            "kd_keyspace_exhausted", "1 once the sequence is used up", TYPE, registry=registry
        )


def serve(registry: CollectorRegistry, host: str, port: int | None) -> None:
    """Expose ``registry`` over HTTP in a background thread when a port is set."""
    if port is not None:
        start_http_server(port, addr=host, registry=registry)


# Request latency buckets (seconds), dense below a millisecond where the dispenser lives.
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class DispenserMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.issued = Counter("kd_keys_issued", "Keys handed out", TYPE, registry=registry)
        self.errors = Counter(
            "kd_request_errors", "Error answers by errorCode", ["code"], registry=registry
        )
        self.latency = Histogram(
            "kd_request_seconds",
            "Request handling time",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.hot_depth = Gauge(
            "kd_hot_depth", "Hot list length seen by the last pop", TYPE, registry=registry
        )
        self.discarded = Counter(
            "kd_hot_keys_discarded",
            "Inherited hot keys a fence discarded (never reissued)",
            registry=registry,
        )
        self.nudges = Counter(
            "kd_keysync_nudges", "Wake-ups sent to keysync", TYPE, registry=registry
        )
        self.pop_requests = Histogram(
            "kd_pop_requests",
            "Single-key requests served by one coalesced Redis call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=registry,
        )
        self.replays = Counter(
            "kd_idempotent_replays",
            "Requests answered from an Idempotency-Key record",
            TYPE,
            registry=registry,
        )


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
            "Keys marked used that the ledger never saw issued",
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
