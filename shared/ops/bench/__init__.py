"""``keydispenser bench TARGET``: throughput measures that write JSON results.

Benchmarks are operator tooling: they live apart from the process packages and from the
tests, and tests never assert their figures.
"""

from __future__ import annotations

from typing import Any

from shared.domain.settings import Settings

TARGETS = ("keygen", "fence", "dispense")
# Benchmarks generate into scratch databases: any permutation key will do there.
BENCH_PERMUTATION_KEY = "keydispenser-benchmark-key"


async def run(
    target: str,
    settings: Settings,
    seconds: float,
    load: str,
    servers: tuple[str, ...] = ("uvicorn", "granian"),
) -> dict[str, Any]:
    """Run one benchmark; the modules load lazily (the dispense bench needs aiohttp)."""
    if target == "keygen":
        from shared.ops.bench import keygen

        return await keygen.run(settings, seconds)
    if target == "fence":
        from shared.ops.bench import fence

        return await fence.run(settings, seconds)
    if target == "dispense":
        from shared.ops.bench import dispense

        return await dispense.run(settings, seconds, load, servers)
    raise ValueError(f"unknown benchmark {target!r}")
