"""``keydispenser simulate``: many seeds of the simulation (world.py), each run checked
step by step against the model (mirror.py); the first failing seed reported with its
trace, and the command that runs it again, exactly.

A run depends on its seed alone: time, uuids and every random draw come from it, and
string hashing is fixed (``PYTHONHASHSEED``, set by ``reexec_pinned`` before anything
runs: an iteration over a set of strings is then the same in every process).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HASH_SEED = "0"
TAIL = 60  # log lines of a failing run shown


@dataclass(frozen=True)
class Outcome:
    """One seed's run, in a form a worker process can send back."""

    seed: int
    failure: str
    steps: int
    answers: int  # PUTs answered (each answer checked against the model's outcome)
    virtual_s: float
    faults: list[str]
    log: list[str]
    trace: list[tuple[str, int, int]]
    keysyncs: int


@dataclass
class Summary:
    first: int
    seeds: int = 0
    failed: list[Outcome] = field(default_factory=list)
    steps: int = 0
    answers: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0

    @property
    def seeds_per_s(self) -> float:
        return self.seeds / self.wall_s if self.wall_s else 0.0

    def report(self) -> dict[str, Any]:
        return {
            "benchmark": "simulate",
            "first_seed": self.first,
            "seeds": self.seeds,
            "failed": [o.seed for o in self.failed],
            "model_steps": self.steps,
            "answers_checked": self.answers,
            "simulated_s": round(self.virtual_s, 1),
            "wall_s": round(self.wall_s, 2),
            "seeds_per_s": round(self.seeds_per_s, 2),
            "python_hash_seed": os.environ.get("PYTHONHASHSEED", ""),
        }


def reexec_pinned() -> None:
    """Run this command again with string hashing fixed, unless it already is."""
    if os.environ.get("PYTHONHASHSEED") == HASH_SEED:
        return
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED)
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def run_one(seed: int) -> Outcome:
    from keydispenser_ops.simulation.world import run_seed

    result = run_seed(seed)
    return Outcome(
        seed=seed,
        failure=result.failure,
        steps=len(result.steps),
        answers=sum(1 for step in result.steps if step[0] == "answer"),
        virtual_s=result.virtual_s,
        faults=[f"{f.kind}({f.arg}) at {f.at:.1f}s" for f in result.plan.faults],
        log=result.log,
        trace=result.steps,
        keysyncs=result.plan.keysyncs,
    )


def outcomes(seeds: Iterable[int], workers: int) -> Iterator[Outcome]:
    """Each seed's outcome, in the order the seeds are given."""
    seeds = list(seeds)
    if workers <= 1 or len(seeds) < 2:
        for seed in seeds:
            yield run_one(seed)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(run_one, seeds, chunksize=4)


def simulate(first: int, count: int, workers: int = 1, *, stop_at_first: bool = True) -> Summary:
    summary = Summary(first)
    started = time.monotonic()
    for outcome in outcomes(range(first, first + count), workers):
        summary.seeds += 1
        summary.steps += outcome.steps
        summary.answers += outcome.answers
        summary.virtual_s += outcome.virtual_s
        if outcome.failure:
            summary.failed.append(outcome)
            if stop_at_first:
                break
    summary.wall_s = time.monotonic() - started
    return summary


def describe(outcome: Outcome, *, whole: bool = False) -> str:
    lines = [
        f"seed {outcome.seed}: {outcome.failure or 'held'}",
        f"  faults: {', '.join(outcome.faults) or 'none'}",
        f"  steps of the model: {outcome.steps}, simulated {outcome.virtual_s:.1f} s",
    ]
    shown = outcome.log if whole else outcome.log[-TAIL:]
    if len(shown) < len(outcome.log):
        lines.append(f"  ... {len(outcome.log) - len(shown)} earlier lines (--seed {outcome.seed})")
    lines.extend(f"  {line}" for line in shown)
    return "\n".join(lines)


def main(first: int, count: int, workers: int, seed: int | None, json_path: str | None) -> int:
    """The command: 0 when every seed held, 1 at the first that did not."""
    reexec_pinned()
    if seed is not None:
        outcome = run_one(seed)
        print(describe(outcome, whole=True))
        return 1 if outcome.failure else 0
    summary = simulate(first, count, workers)
    for outcome in summary.failed:
        print(describe(outcome))
        print(f"run it again: keydispenser simulate --seed {outcome.seed}")
    print(
        f"simulate: {summary.seeds} seeds from {first}, {len(summary.failed)} failed; "
        f"{summary.steps} steps of the model checked ({summary.answers} PUTs answered), "
        f"{summary.virtual_s:.0f} s simulated "
        f"in {summary.wall_s:.1f} s ({summary.seeds_per_s:.1f} seeds/s, {workers} workers)"
    )
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(summary.report(), indent=2) + "\n")
    return 1 if summary.failed else 0
