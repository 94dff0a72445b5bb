from __future__ import annotations

import pytest

from keygen.headroom import HeadroomWatch


def test_each_threshold_is_reported_once_when_crossed() -> None:
    watch = HeadroomWatch(1_000, (0.5, 0.1))
    assert watch.observe(0.0, 100, None).crossed == ()
    assert watch.observe(1.0, 600, None).crossed == (0.5,)
    assert watch.observe(2.0, 700, None).crossed == ()
    assert watch.observe(3.0, 950, None).crossed == (0.1,)
    assert watch.observe(4.0, 990, None).crossed == ()


def test_a_jump_past_several_thresholds_reports_them_all() -> None:
    assert HeadroomWatch(100, (0.5, 0.25, 0.1)).observe(0.0, 95, None).crossed == (0.5, 0.25, 0.1)


def test_forecast_uses_the_recent_leasing_rate() -> None:
    watch = HeadroomWatch(10_000, ())
    assert watch.observe(0.0, 0, 0.1).eta_s is None  # one sample: rate unknown
    seen = watch.observe(10.0, 1_000, 0.1)  # 100 counters/s, 9,000 left
    assert seen.eta_s == pytest.approx(90.0)
    assert seen.counters_left == 9_000
    assert seen.estimated_keys_left == 900
    assert seen.fraction_left == pytest.approx(0.9)


def test_exhausted_keyspace() -> None:
    seen = HeadroomWatch(500, (0.01,)).observe(0.0, 500, 0.5)
    assert seen.counters_left == 0 and seen.estimated_keys_left == 0
    assert seen.crossed == (0.01,)


def test_excluded_counters_are_no_headroom() -> None:
    watch = HeadroomWatch(domain=1_000, thresholds=(0.5,))
    seen = watch.observe(0.0, 100, 1.0, excluded=450)
    assert seen.counters_left == 450 and seen.crossed == (0.5,)
