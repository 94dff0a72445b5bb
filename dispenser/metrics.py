"""The dispenser's Prometheus metrics (one registry per process, built in create_app),
and the middleware that times requests into them."""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.types import ASGIApp, Receive, Scope, Send

from shared.metrics import TYPE

# Request latency buckets (seconds), dense below a millisecond where the dispenser lives.
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class DispenserMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.issued = LoopCounter("kd_keys_issued", "Keys handed out", registry)
        self.errors = Counter(
            "kd_request_errors", "Error answers by errorCode", ["code"], registry=registry
        )
        self.latency = RouteLatency(registry)
        self.hot_depth = Gauge(
            "kd_hot_depth", "Hot list length seen by the last pop", TYPE, registry=registry
        )
        self.hot_low = Gauge(
            "kd_hot_low_watermark",
            "The type's hot.low: keysync refills its hot list below it",
            TYPE,
            registry=registry,
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
        self.serving = Gauge(
            "kd_type_serving",
            "1 when the type had hot keys at the last readiness check, else 0",
            TYPE,
            registry=registry,
        )
        self.keys_lost = Counter(
            "kd_keys_taken_not_handed_out",
            "Keys popped and never handed out: the client was gone, or the process "
            "stopped with them prefetched (never reissued)",
            TYPE,
            registry=registry,
        )
        self.api_open = Gauge(
            "kd_api_open",
            "1 when no API keys are configured and the API listens beyond loopback",
            registry=registry,
        )
        self.used_unrecorded = Counter(
            "kd_used_unrecorded",
            "Mark-used calls accepted on a type without a ledger (counted, not recorded)",
            TYPE,
            registry=registry,
        )
        self.machine_id = Gauge(
            "kd_snowflake_machine_id",
            "Machine ID this process holds for a snowflake type; -1 while it holds none",
            TYPE,
            registry=registry,
        )
        self.leases_lost = Counter(
            "kd_snowflake_leases_lost",
            "Machine-ID leases this process lost while holding them (re-acquired after)",
            TYPE,
            registry=registry,
        )
        self.redis_up = Gauge(
            "kd_redis_up",
            "1 when the Redis primary answered the last readiness check, else 0",
            registry=registry,
        )
        self.postgres_up = Gauge(
            "kd_postgres_up",
            "1 when PostgreSQL answered the last readiness check (ledger types only), else 0",
            registry=registry,
        )
        self.ledger_backlog = Gauge(
            "kd_ledger_stream_backlog",
            "Ledger stream entries not yet drained into PostgreSQL, as last read",
            registry=registry,
        )
        self.ledger_unconfirmed = Counter(
            "kd_ledger_unconfirmed_keys",
            "Keys of ledger types popped but never handed out: their issue entry was not "
            "replicated (or fsynced) within ledger_wait_ms (ledger_durability)",
            TYPE,
            registry=registry,
        )
        self.ledger_refusals = Counter(
            "kd_ledger_backlog_refusals",
            "Requests of ledger types refused (503) because the ledger stream is full",
            TYPE,
            registry=registry,
        )

    def watch_stock(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Export ``read()`` (keys prefetched per type) as kd_prefetched_keys, read at
        each scrape (never written on a request)."""
        self.registry.register(_Stock(read))

    def observe_latency(self, route: str, started: float) -> None:
        """Time since ``started`` (``time.perf_counter()``) for a route template."""
        self.latency.observe(route, time.perf_counter() - started)


class LoopCounter(Collector):
    """A counter per ID type, counted on the event loop's thread only (as RouteLatency
    is): an increment is a dict update, with none of prometheus_client's locking."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name, self._documentation = name, documentation
        self._counts: dict[str, float] = {}
        self._more: list[Callable[[], Mapping[str, int]]] = []
        registry.register(self)

    def also(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Add ``read()`` (counts kept elsewhere, per type) to the counts at each scrape."""
        self._more.append(read)

    def seed(self, names: Iterable[str]) -> None:
        """Export 0 for each of ``names`` until it is counted."""
        for name in names:
            self._counts.setdefault(name, 0.0)

    def inc(self, name: str, amount: int = 1) -> None:
        self._counts[name] = self._counts.get(name, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        counts = dict(self._counts)
        for read in self._more:
            for name, more in read().items():
                counts[name] = counts.get(name, 0.0) + more
        family = CounterMetricFamily(self._name, self._documentation, labels=TYPE)
        for name, value in sorted(counts.items()):
            family.add_metric([name], value)
        yield family


class _Stock(Collector):
    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kd_prefetched_keys",
            "Keys this process popped ahead of requests and still holds (prefetch)",
            labels=TYPE,
        )
        for name, count in sorted(self._read().items()):
            family.add_metric([name], count)
        yield family


class RouteLatency(Collector):
    """``kd_request_seconds``: request handling time per route template, a histogram.

    Observed on the event loop's thread only (the fast path and ``Timing`` both run
    there, and so does the /metrics route that reads it), so an observation needs none
    of prometheus_client's locking: a bisection and two additions, on every request.
    """

    def __init__(self, registry: CollectorRegistry, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        if list(buckets) != sorted(set(buckets)) or not all(0 < b < math.inf for b in buckets):
            raise ValueError(f"bucket bounds must be finite, positive and ascending: {buckets}")
        self._bounds = buckets
        # As prometheus_client's own Histogram writes its "le" labels (an untyped helper).
        self._labels = [floatToGoString(b) for b in buckets] + ["+Inf"]  # type: ignore[no-untyped-call]
        # Per route: a count per bucket (the last is +Inf, not cumulative), then the sum.
        self._routes: dict[str, list[float]] = {}
        self._observers: dict[str, Callable[[float], None]] = {}  # per route, made once
        registry.register(self)

    def observe(self, route: str, seconds: float) -> None:
        observe = self._observers.get(route)
        if observe is None:
            observe = self.of(route)
        observe(seconds)

    def of(self, route: str) -> Callable[[float], None]:
        """``observe`` for one route, its counts looked up once (the fast path holds it)."""
        found = self._observers.get(route)
        if found is not None:
            return found
        counts = self._routes[route] = [0] * (len(self._bounds) + 2)
        bounds = self._bounds

        def observe(seconds: float) -> None:
            counts[bisect_left(bounds, seconds)] += 1  # le: a bound's own value is in
            counts[-1] += seconds

        self._observers[route] = observe
        return observe

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "kd_request_seconds", "Request handling time", labels=["route"]
        )
        for route, counts in list(self._routes.items()):
            snapshot = list(counts)
            cumulative, buckets = 0.0, []
            for label, count in zip(self._labels, snapshot[:-1], strict=True):
                cumulative += count
                buckets.append((label, cumulative))
            family.add_metric([route], buckets, snapshot[-1])
        yield family


class Timing:
    """Pure ASGI middleware: request latency per route template into a histogram."""

    def __init__(
        self, app: ASGIApp, metrics: DispenserMetrics, self_timed: frozenset[str] = frozenset()
    ) -> None:
        """``self_timed``: route templates whose endpoint observes its own latency."""
        self._app = app
        self._metrics = metrics
        self._self_timed = self_timed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self._app(scope, receive, send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            if route not in self._self_timed:
                self._metrics.observe_latency(route, started)
