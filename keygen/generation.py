"""Key generation off the event loop, in parallel blocks.

numpy releases the GIL inside its inner loops, so blocks of one slice run on
several cores from one process. Each block is bounded in size, so the event
loop (heartbeats, signals, metrics) never waits long for the CPU.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

from shared.domain.idtypes import IdType

# Measured on 2 cores (docs/benchmarks.md): one block per thread, blocks of
# 2**17..2**19 candidates; smaller blocks pay numpy's per-call overhead.
MIN_BLOCK = 1 << 16
MAX_BLOCK = 1 << 19


def blocks(start: int, stop: int, threads: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into equal blocks: at least one per thread when big enough."""
    n = stop - start
    parts = max(threads, -(-n // MAX_BLOCK))
    parts = max(1, min(parts, -(-n // MIN_BLOCK)))
    size = -(-n // parts)
    return [(s, min(s + size, stop)) for s in range(start, stop, size)]


class Generator:
    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="keygen")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    async def generate(self, id_type: IdType, start: int, stop: int) -> tuple[list[str], int]:
        """Keys for counters ``[start, stop)`` in counter order: (keys, candidates)."""
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(self._pool, id_type.generate, a, b)
                for a, b in blocks(start, stop, self.threads)
            )
        )
        keys: list[str] = []
        for block_keys, _ in parts:
            keys.extend(block_keys)
        return keys, sum(candidates for _, candidates in parts)
