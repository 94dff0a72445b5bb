"""The snowflake bench's report: headline fields from one worker, targets per run."""

from __future__ import annotations

from typing import Any

from keydispenser_ops.bench.snowflake import TARGETS, report


def run(bare: int, single: int, batch: int) -> dict[str, Any]:
    return {"bare_rps": bare, "single_rps": single, "batch_ids_per_s": batch}


def test_report_fields_and_targets() -> None:
    runs = {"workers_1": run(10_000, 9_500, 1_200_000), "workers_2": run(20_000, 15_000, 900_000)}
    got = report(runs, 6_000_000.4, 3_900_000.0, 2, "wrk", 3.0)
    assert got["inprocess_ids_per_s"] == 6_000_000
    assert got["inprocess_default_layout_ids_per_s"] == 3_900_000
    assert (got["single_rps"], got["bare_rps"], got["batch_ids_per_s"]) == (
        9_500,
        10_000,
        1_200_000,
    )
    assert got["runs"]["workers_1"]["single_vs_bare"] == 0.95
    assert got["workers_1_targets_met"] is True
    assert got["runs"]["workers_2"]["targets_met"] == {
        "single_vs_bare": False,
        "batch_ids_per_s": False,
        "inprocess_ids_per_s": True,
    }
    assert got["targets"] == TARGETS and got["layout"]["sequence"] == 14
