from __future__ import annotations

import pytest

from keydispenser_ops.drill.load import RecordingLoad


def load_with(events: list[tuple[float, bool]]) -> RecordingLoad:
    load = RecordingLoad(["http://127.0.0.1:1"], "t")
    load.events = events
    return load


def test_a_killed_primary_counts_from_the_fault_to_the_next_key() -> None:
    events = [(9.9, True), (10.01, False), (11.0, False), (12.5, True), (12.6, True)]
    began, length = load_with(events).disruption(10.0, 20.0)
    assert began == pytest.approx(0.0)
    assert length == pytest.approx(2500.0)


def test_a_split_brain_counts_from_the_last_key_before_the_stretch() -> None:
    # Served for 5 s by the old primary, then 0.3 s without keys, then served again.
    events = [(10.0 + i / 10, True) for i in range(51)] + [(15.3, True), (15.4, True)]
    began, length = load_with(sorted(events)).disruption(10.0, 20.0)
    assert began == pytest.approx(5000.0)
    assert length == pytest.approx(300.0)


def test_events_after_the_window_are_ignored_and_no_key_is_minus_one() -> None:
    assert load_with([(25.0, True)]).disruption(10.0, 20.0) == (0.0, -1.0)


def test_duplicates_are_counted() -> None:
    load = load_with([])
    load.keys.update(["a", "b", "a"])
    assert (load.dispensed, load.duplicates) == (3, 1)


def test_a_quiet_spell_is_left_out_of_the_stretch_without_keys() -> None:
    """The load paused on purpose (a quiet spell of the ledger after a PostgreSQL
    promotion) for 12 s: only the 0.5 s before it and the 0.3 s after it count."""
    load = load_with([(10.5, True), (23.3, True)])
    load.quiet = [(11.0, 23.0)]
    began, length = load.disruption(10.0, 30.0)
    assert length == pytest.approx(800.0)
    assert began == pytest.approx(500.0)
