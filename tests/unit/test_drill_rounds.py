"""The round record both drills share: its JSON row has the fault's own figures inline
and none of the private clock readings."""

from __future__ import annotations

from keydispenser_ops.drill.rounds import Round


def test_a_rounds_row_shows_its_figures_inline_and_its_wall_time() -> None:
    done = Round(3, "shard_restart_empty", 10.0, 12.5, 1_700_000_000.25, None, 7)
    done.figures = {"primary_before": "127.0.0.1:7001", "identity_changed": True}
    done.fence_engaged, done.loss_from = True, 9.0
    row = done.row()
    assert row["round"] == 3 and row["fault"] == "shard_restart_empty"
    assert row["fault_at"] == "22:13:20.250"
    assert row["primary_before"] == "127.0.0.1:7001" and row["identity_changed"] is True
    assert row["fence_engaged"] is True and row["keys_discarded"] == 7
    assert not {"began", "ended", "wall", "loss_from", "figures", "number"} & row.keys()
