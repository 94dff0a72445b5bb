"""``keydispenser status``: inventory and keyspace headroom per type."""

from __future__ import annotations

from typing import Any

from shared.domain.idtypes import build_id_types
from shared.domain.settings import Settings
from shared.stores.cold_store import ColdStore
from shared.stores.hot_store import HotStore

_STATUS_CAP = 10_000_000


async def collect_status(settings: Settings) -> dict[str, Any]:
    cold = await ColdStore.connect(settings.postgres_dsn)
    hot = HotStore.from_settings(settings)
    report: dict[str, Any] = {}
    try:
        for name, id_type in build_id_types(settings, generating=False).items():
            state = await cold.sequence_state(id_type)
            ranges = await cold.range_stats(name)
            rate = ranges["accepted"] / ranges["candidates"] if ranges["candidates"] else None
            report[name] = {
                "hot_depth": await hot.depth(name),
                "cold_depth": await cold.depth(name, _STATUS_CAP),
                "ranges_leased": ranges["leased"],
                "ranges_filled": ranges["filled"],
                "counters_leased": state.leased_counters,
                "counters_headroom": state.headroom,
                "headroom_fraction": state.headroom / state.domain,
                "acceptance_rate": rate,
                "estimated_keys_left": None if rate is None else int(state.headroom * rate),
            }
    finally:
        await cold.close()
        await hot.close()
    return report


def format_status(report: dict[str, Any]) -> str:
    columns = ("hot_depth", "cold_depth", "ranges_leased", "ranges_filled", "counters_headroom")
    lines = ["id_type".ljust(16) + "".join(c.rjust(20) for c in (*columns, "headroom_%"))]
    for name, row in report.items():
        cells = [str(row[c]) for c in columns] + [f"{100 * row['headroom_fraction']:.4f}"]
        lines.append(name.ljust(16) + "".join(cell.rjust(20) for cell in cells))
    return "\n".join(lines)
