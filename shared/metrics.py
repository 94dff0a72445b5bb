"""Metrics plumbing common to every process; each process defines its own metrics.

keygen and keysync serve their registry on their metrics port together with two
probes: ``/healthz`` (liveness: the process loop beat recently, not only the port is
open) and ``/readyz`` (started, the loop alive and its last iteration reached its
stores).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from shared.domain.errors import (
    ConfigError,
    FenceHalted,
    LedgerHalted,
    NamespaceBound,
    PostgresBehind,
    PostgresSuperseded,
    RangeFenced,
)
from shared.domain.tiers import FenceReport

# What the PostgreSQL fence refuses with: keygen and keysync keep retrying (with
# back-off, saying why) rather than exit; each resumes by itself, or after the one
# documented operator command (`fence-postgres`) for a halt.
FENCE_REFUSALS: tuple[type[BaseException], ...] = (
    PostgresBehind,
    PostgresSuperseded,
    FenceHalted,
    RangeFenced,
    LedgerHalted,
    # At run time (Redis lost the binding, another environment bound it first): refused
    # until an operator points it right or takes over; at start-up it ends the process.
    NamespaceBound,
)

TYPE = ["id_type"]
STALL_AFTER_S = 120.0  # a loop that has not beaten for this long is not alive


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
        self.halted = Gauge(
            "kd_postgres_fence_halted",
            "1 while leases/syncs are halted until an operator runs fence-postgres",
            registry=registry,
        )
        self.superseded = Gauge(
            "kd_postgres_superseded",
            "1 while the PostgreSQL reached is an old primary a newer one superseded "
            "(leases/syncs through it refused until the DSN leads to the new primary)",
            registry=registry,
        )

    def refusing(self, exc: BaseException | None) -> None:
        """The gauges for why the last iteration was refused (None: it was not)."""
        self.halted.set(1 if isinstance(exc, FenceHalted) else 0)
        self.superseded.set(1 if isinstance(exc, PostgresSuperseded) else 0)

    def observe(self, report: FenceReport) -> None:
        self.fences.labels(report.reason).inc()
        for name, keys in report.keys_discarded.items():
            self.discarded.labels(name).inc(keys)


class Heartbeat:
    """The pulse of a process loop: each iteration beats, saying whether it reached
    its stores. Alive while starting (the startup probe bounds that) and while beats
    keep coming; ready once the loop runs and its last iteration succeeded."""

    def __init__(
        self,
        registry: CollectorRegistry,
        stall_after_s: float = STALL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stall_after_s = stall_after_s
        self._clock = clock
        self._last: float | None = None
        self._ok = False
        self._gauge = Gauge(
            "kd_loop_heartbeat_timestamp_seconds",
            "Unix time of the process loop's last iteration",
            registry=registry,
        )

    def beat(self, ok: bool = True) -> None:
        self._last = self._clock()
        self._ok = ok
        self._gauge.set_to_current_time()

    def alive(self) -> bool:
        return self._last is None or self._clock() - self._last <= self._stall_after_s

    def ready(self) -> bool:
        return self._last is not None and self._ok and self.alive()


def _handler(
    registry: CollectorRegistry, heartbeat: Heartbeat | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/readyz"):
                check = heartbeat is None or (
                    heartbeat.alive() if path == "/healthz" else heartbeat.ready()
                )
                self._answer(200 if check else 503, b"ok\n" if check else b"not ok\n", "text/plain")
            elif path == "/metrics":
                self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per probe would drown the process's own log

    return Handler


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int | None,
    heartbeat: Heartbeat | None = None,
    setting: str = "metrics_port",
) -> ThreadingHTTPServer | None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` in a background thread when a
    port is set; returns the server (``shutdown()`` stops it)."""
    if port is None:
        return None
    try:
        server = ThreadingHTTPServer((host, port), _handler(registry, heartbeat))
    except OSError as exc:  # in use, or not an address of this host: the setting's to fix
        raise ConfigError(
            f"{setting}: cannot listen on {host}:{port} for /metrics: {exc.strerror or exc}"
        ) from exc
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
