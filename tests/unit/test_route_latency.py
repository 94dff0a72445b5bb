"""The dispenser's request-latency histogram (kept without locks, on the event loop's
thread) reads exactly as prometheus_client's own Histogram would, and the single-ID
envelope (its head cached per millisecond) carries the time it was written."""

from __future__ import annotations

import calendar
import json
import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from dispenser import envelope
from dispenser.metrics import LATENCY_BUCKETS, RouteLatency

ROUTES = ("/v1/idgenerator/{id_type}/id", "/v1/keys/{id_type}")
# Bounds themselves, values between them, past the last, zero.
SECONDS = st.one_of(st.sampled_from((0.0, *LATENCY_BUCKETS, 2.5)), st.floats(0, 3))


def exposition(registry: CollectorRegistry) -> list[str]:
    """The text a scrape gets, without the creation-time samples (a custom collector
    has no _created; nothing reads them)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


@given(st.lists(st.tuples(st.sampled_from(ROUTES), SECONDS), max_size=60))
def test_the_histogram_reads_as_prometheus_clients_own(
    observations: list[tuple[str, float]],
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    latency = RouteLatency(ours)
    reference = Histogram(
        "kd_request_seconds",
        "Request handling time",
        ["route"],
        buckets=LATENCY_BUCKETS,
        registry=theirs,
    )
    for route, seconds in observations:
        latency.observe(route, seconds)
        reference.labels(route).observe(seconds)
    assert exposition(ours) == exposition(theirs)


def test_a_value_on_a_bound_is_counted_in_that_bound() -> None:
    registry = CollectorRegistry()
    RouteLatency(registry).observe("/r", 0.001)
    text = generate_latest(registry).decode()
    assert 'kd_request_seconds_bucket{le="0.0005",route="/r"} 0.0' in text
    assert 'kd_request_seconds_bucket{le="0.001",route="/r"} 1.0' in text
    assert 'kd_request_seconds_count{route="/r"} 1.0' in text


@pytest.mark.parametrize("buckets", [(0.5, 0.1), (0.1, 0.1), (0.1, math.inf), (0.0, 0.1)])
def test_bounds_out_of_order_or_infinite_are_refused(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="ascending"):
        RouteLatency(CollectorRegistry(), buckets)


def test_each_single_id_envelope_carries_the_millisecond_it_was_written() -> None:
    for key in ("3029384756", "abc", "3029384757"):
        before = time.time()
        body = json.loads(envelope.ok_id(key))
        after = time.time()
        assert body["response"] == {"id": key}
        assert body["errors"] == []
        written = time.strptime(body["responsetime"][:19], "%Y-%m-%dT%H:%M:%S")
        ms = int(body["responsetime"][20:23])
        stamp = calendar.timegm(written) + ms / 1000  # the text is UTC
        assert int(before * 1000) <= round(stamp * 1000) <= int(after * 1000)
        time.sleep(0.002)  # the next envelope is in a later millisecond
