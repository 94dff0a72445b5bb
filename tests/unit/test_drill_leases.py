"""The drill's lease checks: intervals read from holders' log lines, overlaps found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from keydispenser_ops.drill.leases import (
    SNOWFLAKE_TYPE,
    SNOWFLAKE_TYPE_CONFIG,
    Interval,
    _described,
    not_observed,
    overlaps,
    read_intervals,
)
from keydispenser_ops.drill.load import SnowflakeLoad


def line(event: str, owner: str, machine_id: int = 1, **times: float) -> str:
    fields = {"event": event, "pool": "p", "machine_id": machine_id, "owner": owner}
    return json.dumps(fields | times)


def write(path: Path, *lines: str) -> None:
    path.write_text("\n".join([*lines, '{"event": "lease_gran']) + "\n")  # a cut last line


def held(owner: str, start: float, end: float, machine_id: int = 1) -> Interval:
    return Interval("p", machine_id, owner, "dispenser-0", start, end)


def test_an_interval_runs_from_grant_to_stop_or_to_the_last_deadline(tmp_path: Path) -> None:
    write(
        tmp_path / "dispenser-0.log",
        line("lease_granted", "h-10#a", granted_at=100.0, deadline_at=2_800.0),
        line("lease_renewed", "h-10#a", deadline_at=3_300.0),
        line("lease_stopped", "h-10#a", stopped_at=3_100.0),
        line("lease_granted", "h-11#b", machine_id=2, granted_at=200.0, deadline_at=2_900.0),
        line("lease_renewed", "h-11#b", deadline_at=3_400.0),  # then killed: no stop
    )
    by_owner = {i.owner: i for i in read_intervals(tmp_path)}
    assert (by_owner["h-10#a"].start, by_owner["h-10#a"].end) == (100.0, 3_100.0)
    assert by_owner["h-10#a"].stopped and by_owner["h-10#a"].pid == 10
    assert (by_owner["h-11#b"].end, by_owner["h-11#b"].stopped) == (3_400.0, False)
    assert [by_owner[o].renewals for o in ("h-10#a", "h-11#b")] == [1, 1]


def test_a_grant_before_the_previous_holders_deadline_is_an_overlap() -> None:
    found = overlaps([held("a", 0, 3_000), held("b", 2_990, 6_000), held("c", 6_000, 9_000)])
    assert [(f["holders"], f["overlap_ms"]) for f in found] == [(["a", "b"], 10.0)]


def test_other_machine_ids_and_back_to_back_intervals_do_not_overlap() -> None:
    assert overlaps([held("a", 0, 3_000), held("b", 3_000, 6_000), held("c", 10, 20, 2)]) == []


def test_an_interval_inside_another_is_an_overlap() -> None:
    assert len(overlaps([held("a", 0, 9_000), held("b", 5_000, 6_000)])) == 1


def test_snowflake_duplicates_are_counted() -> None:
    load = SnowflakeLoad(["http://127.0.0.1:1"], SNOWFLAKE_TYPE, SNOWFLAKE_TYPE_CONFIG)
    load.ids.extend([5, 6, 7, 6, 5, 5])
    assert load.duplicates() == 3


def test_a_lease_fault_that_did_not_show_fails_its_round() -> None:
    rows: list[dict[str, Any]] = [
        {"round": 1, "error": None, "regranted": True},
        {"round": 2, "error": None, "regranted": False},
        {"round": 3, "error": None, "clock_behind_503s": 0},
        {"round": 4, "error": None, "leases_reacquired": False},
        {"round": 5, "error": None, "clock_behind_503s": 7, "leases_reacquired": True},
        {"round": 6, "error": "could not inject", "regranted": False},
    ]
    assert not_observed(rows) == [2, 3, 4]


def test_the_holders_process_is_read_from_its_owner_token() -> None:
    assert held("my-host-42#9f", 0, 1).pid == 42
    assert held("my-host-43:sleep#9f", 0, 1).pid == 43  # keydispenser lease -- sleep


def test_a_lease_check_that_fails_names_the_interval_relative_to_the_fault() -> None:
    described = _described(Interval("p", 3, "h-42#x", "dispenser-1", 1_500.0, 4_000.0), 1_000.0)
    assert described == {
        "pool": "p",
        "machine_id": 3,
        "holder": "dispenser-1:42",
        "start_ms": 500,
        "end_ms": 3_000,
        "stopped": False,
    }
    assert _described(None, 1_000.0) is None  # a holder that logged no lease at all
