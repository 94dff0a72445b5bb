"""A dispenser with several worker processes (``dispenser.workers``, granian's workers)
answers ``/metrics`` for all of them: a scrape reaches one worker, and its own counts
alone would make a counter go backwards from one scrape to the next.

Each worker writes its own exposition to a file of the directory its supervisor made
(``KD_WORKER_METRICS_DIR``) every ``SNAPSHOT_EVERY_S`` and whenever it is scraped; the
scraped one merges every file. Counters and histograms are summed over every worker
that ever ran under this supervisor (a worker that exited keeps its last counts, so a
restarted worker does not take them back); ``_created`` is the earliest. A gauge is the
scraped worker's own (state every worker sees alike: Redis up, a hot list's depth),
except those that count something each worker holds (``SUMMED_GAUGES``), summed over
the workers alive. Each file only grows between two reads of it, so a sum never goes
backwards. Requests never touch a file: the hot path is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from shared.runtime import pid_alive

ENV: Final = "KD_WORKER_METRICS_DIR"
SNAPSHOT_EVERY_S: Final = 1.0
# Gauges of what each worker holds by itself: summed over the live workers.
SUMMED_GAUGES: Final = frozenset({"kd_prefetched_keys"})
_ADDED: Final = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
_SUFFIX: Final = ".prom"

Key = tuple[str, tuple[tuple[str, str], ...]]


class WorkerMetrics:
    """This worker's share of the supervisor's directory."""

    def __init__(self, registry: CollectorRegistry, directory: Path, pid: int | None = None):
        self.registry = registry
        self.directory = directory
        self.pid = pid if pid is not None else os.getpid()
        self._file = directory / f"{self.pid}{_SUFFIX}"

    @classmethod
    def from_environment(cls, registry: CollectorRegistry) -> WorkerMetrics | None:
        named = os.environ.get(ENV)
        return cls(registry, Path(named)) if named else None

    def snapshot(self) -> bytes:
        """Write this worker's exposition (atomically: a reader sees the last whole one)."""
        text = generate_latest(self.registry)
        staged = self._file.with_suffix(".tmp")
        staged.write_bytes(text)
        os.replace(staged, self._file)
        return text

    async def keep_writing(self) -> None:
        """Snapshot every SNAPSHOT_EVERY_S until cancelled, and once more then (a worker
        that stops leaves its final counts)."""
        try:
            while True:
                self.snapshot()
                await asyncio.sleep(SNAPSHOT_EVERY_S)
        finally:
            with contextlib.suppress(OSError):
                self.snapshot()

    def exposition(self) -> bytes:
        """Every worker's metrics as one process's (module docstring)."""
        own = self.snapshot().decode()
        others: dict[int, str] = {}
        for path in self.directory.glob(f"*{_SUFFIX}"):
            pid = int(path.stem) if path.stem.isdigit() else None
            if pid is None or pid == self.pid:
                continue
            with contextlib.suppress(FileNotFoundError):
                others[pid] = path.read_text()
        live = {pid for pid in others if pid_alive(pid)}
        return merge(own, others, live)


def merge(own: str, others: dict[int, str], live: set[int]) -> bytes:
    """``own`` exposition with ``others`` (by pid) merged in as the module says."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[Key, float]] = {}
    for source, text in [(None, own), *others.items()]:
        for family in text_string_to_metric_families(text):
            summed = family.type in _ADDED or family.name in SUMMED_GAUGES
            if source is not None and not summed:
                continue  # a gauge: the scraped worker's own
            if source is not None and family.type not in _ADDED and source not in live:
                continue  # a summed gauge of a worker that exited: it holds nothing now
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            into = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in into:
                    into[key] = sample.value
                elif sample.name.endswith("_created"):
                    into[key] = min(into[key], sample.value)
                else:
                    into[key] += sample.value
    for name, metric in families.items():
        for (sample_name, labels), value in values[name].items():
            metric.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics
