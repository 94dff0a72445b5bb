"""keygen's Prometheus metrics (one registry per process, built in main)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.metrics import TYPE, FenceMetrics


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
        self.fence = FenceMetrics(registry)
