"""The dispenser's Prometheus metrics (one registry per process, built in create_app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import TYPE

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
