"""Metrics plumbing common to every process; each process defines its own metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server

from shared.stores.postgres_fence import FenceReport

TYPE = ["id_type"]


def serve(registry: CollectorRegistry, host: str, port: int | None) -> None:
    """Expose ``registry`` over HTTP in a background thread when a port is set."""
    if port is not None:
        start_http_server(port, addr=host, registry=registry)


class FenceMetrics:
    """The PostgreSQL fence, as seen by the process that ran it (keygen or keysync)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.fences = Counter(
            "kd_postgres_fences",
            "PostgreSQL fences run (lost commits detected), by reason",
            ["reason"],
            registry=registry,
        )
        self.discarded = Counter(
            "kd_postgres_fence_keys_discarded",
            "Cold keys a PostgreSQL fence discarded (never reissued)",
            TYPE,
            registry=registry,
        )

    def observe(self, report: FenceReport) -> None:
        self.fences.labels(report.reason).inc()
        for name, keys in report.keys_discarded.items():
            self.discarded.labels(name).inc(keys)
