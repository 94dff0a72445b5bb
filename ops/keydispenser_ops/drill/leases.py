"""The drill's machine-ID leases and snowflake IDs: load, lease faults, interval checks.

Each dispenser runs two worker processes; each worker leases its own machine ID for the
snowflake type (four IDs for four workers: a killed worker's ID can only come back to a
new holder after its lease expired); two ``keydispenser lease -- sleep`` processes hold
the two IDs of a second pool. Lease intervals are read from the holders' own log
lines (``lease_granted``, ``lease_renewed``, ``lease_stopped``: wall times of this host)
and checked for overlap; snowflake IDs received from both dispensers are checked for
duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispenser import codes
from keydispenser_ops.drill.fleet import Fleet, children
from keydispenser_ops.drill.load import SnowflakeLoad
from shared.domain.errors import ClockBehind

log = logging.getLogger(__name__)
SNOWFLAKE_TYPE = "drill_sf"
SNOWFLAKE_TYPE_CONFIG: dict[str, Any] = {
    "kind": "snowflake",
    "machine_ids": {"min": 0, "max": 3},  # one ID per worker, none spare
    "lease_ttl_s": 3.0,
    "lease_renew_s": 0.5,
    "max_backwards_ms": 50,
}
WORKERS = 2  # per dispenser
CLOCK_STEP_MS = 1_500  # clock_back: well beyond max_backwards_ms
CLOCK_ENV = "KD_TEST_CLOCK_STEP_MS"
REGRANT_DEADLINE_S = 20.0  # a killed holder's ID is granted again within this
REACQUIRE_DEADLINE_S = 25.0  # every worker holds a new lease this long after a Redis fault
CLOCK_OBSERVE_S = 3.0  # clock_back: how long the 503s are counted
CLOCK_BEHIND = codes.BY_ERROR[ClockBehind].code


# `keydispenser lease -- sleep` holders: two processes, two IDs, none spare.
CLI_POOL = "drill_cli"
CLI_HOLDERS = ("lease-0", "lease-1")
CLI_ARGS = (
    *("--pool", CLI_POOL, "--min", "0", "--max", str(len(CLI_HOLDERS) - 1)),
    *("--ttl", "3", "--renew-every", "0.5", "--wait", "30", "--", "sleep", "100000"),
)
LOST_LEASE_EXIT = 128 + signal.SIGTERM  # the command was ended because its lease was lost


def dispenser_env() -> dict[str, str]:
    """Two workers per dispenser, each with the test clock hook armed."""
    return {"KD_DISPENSER__WORKERS": str(WORKERS), CLOCK_ENV: str(CLOCK_STEP_MS)}


@dataclass
class Interval:
    """One holder's use of one machine ID, on this host's wall clock (unix ms)."""

    pool: str
    machine_id: int
    owner: str
    dispenser: str
    start: float
    end: float  # when it stopped, else its last deadline (a killed holder)
    stopped: bool = False
    renewals: int = 0  # lease_renewed lines read (each may move ``end`` later)

    @property
    def pid(self) -> int:
        """The holder's process (the owner token is ``host-pid[:command]#suffix``)."""
        return int(self.owner.rsplit("#", 1)[0].rsplit("-", 1)[1].split(":")[0])


def _lease_lines(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(errors="replace").splitlines():
        if '"lease_' not in line:
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue  # a line cut by a SIGKILL


def read_intervals(log_dir: Path) -> list[Interval]:
    """Every lease interval the dispensers' workers logged."""
    intervals: dict[str, Interval] = {}
    paths = [*log_dir.glob("dispenser-*.log"), *log_dir.glob("lease-*.log")]
    for path in sorted(paths):
        for entry in _lease_lines(path):
            _apply(intervals, entry, path.stem)
    return list(intervals.values())


def _apply(intervals: dict[str, Interval], entry: dict[str, Any], dispenser: str) -> None:
    event, owner = entry.get("event"), entry.get("owner")
    if owner is None:
        return
    if event == "lease_granted":
        intervals[owner] = Interval(
            entry["pool"],
            int(entry["machine_id"]),
            owner,
            dispenser,
            float(entry["granted_at"]),
            float(entry["deadline_at"]),
        )
    elif owner in intervals and not intervals[owner].stopped:
        held = intervals[owner]
        if event == "lease_renewed":
            held.end = max(held.end, float(entry["deadline_at"]))
            held.renewals += 1
        elif event == "lease_stopped":
            held.end, held.stopped = float(entry["stopped_at"]), True


def overlaps(intervals: list[Interval]) -> list[dict[str, Any]]:
    """Pairs of holders of one (pool, machine ID) whose intervals overlap."""
    found: list[dict[str, Any]] = []
    by_id: dict[tuple[str, int], list[Interval]] = {}
    for held in intervals:
        by_id.setdefault((held.pool, held.machine_id), []).append(held)
    for (pool, machine_id), holders in by_id.items():
        holders.sort(key=lambda h: h.start)
        for i, first in enumerate(holders):
            for later in holders[i + 1 :]:
                if later.start >= first.end:
                    break
                found.append(
                    {
                        "pool": pool,
                        "machine_id": machine_id,
                        "holders": [first.owner, later.owner],
                        "overlap_ms": round(min(first.end, later.end) - later.start, 3),
                    }
                )
    return found


def worker_pids(supervisor: int) -> list[int]:
    """The uvicorn worker processes of one dispenser (children running multiprocessing)."""
    pids: list[int] = []
    for pid in children(supervisor):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in argv and b"resource_tracker" not in argv:
            pids.append(pid)
    return sorted(pids)


@dataclass
class LeaseFaults:
    """Lease faults and the checks that follow them."""

    fleet: Fleet
    load: SnowflakeLoad
    kills: list[dict[str, Any]] = field(default_factory=list)
    holder_exits: Counter[int] = field(default_factory=Counter)  # exit status -> count
    _turn: int = 0
    _kills: int = 0

    def start_cli_holders(self) -> None:
        for name in CLI_HOLDERS:
            self.fleet.expected_exits.add(name)
            self.fleet.spawn(name, "lease", None, CLI_ARGS)

    def respawn_cli_holders(self) -> None:
        """Start again the holders that ended (a lost lease ends its command: exit 143),
        as a service manager would; every exit status is counted."""
        for name in CLI_HOLDERS:
            status = self.fleet.processes[name].poll()
            if status is not None:
                self.holder_exits[status] += 1
                self.fleet.restart(name)

    async def supervise(self, stop: asyncio.Event, deadline: float) -> None:
        """Start ended CLI holders again within 0.2 s, until ``stop`` or ``deadline``."""
        while not stop.is_set() and time.monotonic() < deadline:
            self.respawn_cli_holders()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    def holder_pids(self) -> set[int]:
        """Every lease holder now running: dispenser workers and CLI holders."""
        pids = {
            pid
            for name in ("dispenser-0", "dispenser-1")
            for pid in worker_pids(self.fleet.processes[name].pid)
        }
        live = (self.fleet.processes[n] for n in CLI_HOLDERS)
        return pids | {p.pid for p in live if p.poll() is None}

    @property
    def log_dir(self) -> Path:
        return self.fleet.log_dir

    def _pick_worker(self) -> tuple[str, int]:
        """A dispenser worker, alternating between dispensers and workers."""
        self._turn += 1
        name = f"dispenser-{self._turn % 2}"
        pids = worker_pids(self.fleet.processes[name].pid)
        if not pids:
            raise RuntimeError(f"{name} has no worker process")
        return name, pids[(self._turn // 2) % len(pids)]

    def _held_by(self, pid: int) -> Interval:
        live = [h for h in read_intervals(self.log_dir) if h.pid == pid and not h.stopped]
        if not live:
            raise RuntimeError(f"worker {pid} holds no lease")
        return max(live, key=lambda h: h.start)

    async def kill_lease_holder(self) -> dict[str, Any]:
        """SIGKILL a lease holder, in turn a dispenser worker (uvicorn starts a new one)
        and a ``keydispenser lease -- sleep`` process (started again at once); its ID
        must be granted again, and only after the killed holder's deadline."""
        self._kills += 1
        if self._kills % 2:
            name, pid = self._pick_worker()
        else:
            name = CLI_HOLDERS[(self._kills // 2) % len(CLI_HOLDERS)]
            pid = self.fleet.processes[name].pid
        held = await self._wait_held(pid)
        if name in CLI_HOLDERS:
            self.fleet.kill(name)  # and its command
        else:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.time() * 1000
        if name in CLI_HOLDERS:
            self.fleet.restart(name)  # waits (--wait) for a free ID: only the killed one
        regrant = await self._wait_regrant(held, killed_at)
        figures = {
            "killed_worker": f"{name}:{pid}",
            "killed_machine_id": held.machine_id,
            "regranted": regrant is not None,
        }
        if regrant is not None:
            # After its deadline (no overlap), and after Redis let the lease expire.
            figures["regrant_after_deadline_ms"] = round(regrant.start - held.end, 1)
            figures["regrant_after_kill_ms"] = round(regrant.start - killed_at, 1)
            figures["regranted_to"] = f"{regrant.dispenser}:{regrant.pid}"
        else:
            # Who logged a grant of that ID last: a failed round explains itself.
            same = [
                h
                for h in read_intervals(self.log_dir)
                if (h.pool, h.machine_id) == (held.pool, held.machine_id)
            ]
            figures["killed_interval"] = _described(held, killed_at)
            figures["holders_of_the_id"] = [
                _described(h, killed_at) for h in sorted(same, key=lambda h: h.start)[-3:]
            ]
        self.kills.append(figures)
        return figures

    async def _wait_held(self, pid: int) -> Interval:
        deadline = time.monotonic() + REGRANT_DEADLINE_S
        while True:
            try:
                return self._held_by(pid)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    async def _wait_regrant(self, held: Interval, after_ms: float) -> Interval | None:
        deadline = time.monotonic() + REGRANT_DEADLINE_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            for other in read_intervals(self.log_dir):
                same = (other.pool, other.machine_id) == (held.pool, held.machine_id)
                if same and other.owner != held.owner and other.start > held.start:
                    return other
        return None

    async def clock_back(self) -> dict[str, Any]:
        """Step one worker's minting clock back by CLOCK_STEP_MS (SIGUSR1, the test
        hook): it must refuse (503 IDG-015) or wait, never mint an ID twice."""
        name, pid = self._pick_worker()
        await self._wait_held(pid)  # minting, so that the step can show
        at = time.monotonic()
        os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(CLOCK_OBSERVE_S)
        return {
            "clock_stepped_worker": f"{name}:{pid}",
            "clock_step_ms": CLOCK_STEP_MS,
            "clock_behind_503s": self.load.errors_since(at, CLOCK_BEHIND),
        }

    async def reacquired(self, since_ms: float) -> dict[str, Any]:
        """After a Redis fault: every holder (dispenser workers, CLI holders started again
        after their lease ended) holds a live lease granted after ``since_ms``."""
        started = time.monotonic()
        while time.monotonic() - started < REACQUIRE_DEADLINE_S:
            self.respawn_cli_holders()
            workers = self.holder_pids()
            latest: dict[int, Interval] = {}  # worker -> its latest lease
            for held in read_intervals(self.log_dir):
                if held.pid not in latest or held.start > latest[held.pid].start:
                    latest[held.pid] = held
            # Held now, and granted after the fault (failback changes hands twice).
            fresh = {p: h for p, h in latest.items() if h.start > since_ms and not h.stopped}
            if workers and workers <= fresh.keys():
                last = max(fresh[pid].start for pid in workers)
                return {"leases_reacquired": True, "reacquired_ms": round(last - since_ms)}
            await asyncio.sleep(0.2)
        # Which holders had none, and the last lease each of them logged: a failed round
        # explains itself in the report.
        missing = [
            {"pid": pid, "latest": _described(latest.get(pid), since_ms)}
            for pid in sorted(workers - fresh.keys())
        ]
        return {"leases_reacquired": False, "leases_missing": missing}

    def report(self) -> LeaseReport:
        intervals = read_intervals(self.log_dir)
        found = overlaps(intervals)
        return LeaseReport(
            lease_intervals=len(intervals),
            lease_renewals=sum(held.renewals for held in intervals),
            lease_overlaps=len(found),
            lease_overlap_pairs=found[:20],
            lease_holder_exits={str(k): v for k, v in sorted(self.holder_exits.items())},
            lease_holder_unexpected_exits=sum(
                n for status, n in self.holder_exits.items() if status != LOST_LEASE_EXIT
            ),
            snowflake_ids=len(self.load.ids),
            snowflake_duplicates=self.load.duplicates(),
            snowflake_errors=dict(self.load.errors),
            snowflake_batches_by_worker=_batches_by_worker(intervals, self.load.batches),
        )


@dataclass(frozen=True)
class LeaseReport:
    """Machine-ID leases and snowflake IDs over the whole drill (field names are the
    JSON report's)."""

    lease_intervals: int
    # Without renewal lines a killed holder's interval would end at its first deadline,
    # shorter than it was, and the overlap check would be weaker.
    lease_renewals: int
    lease_overlaps: int
    lease_overlap_pairs: list[dict[str, Any]]
    lease_holder_exits: dict[str, int]  # exit status -> count
    lease_holder_unexpected_exits: int  # any status but a lost lease's
    snowflake_ids: int
    snowflake_duplicates: int
    snowflake_errors: dict[str, int]
    snowflake_batches_by_worker: dict[str, Any]


def _described(held: Interval | None, since_ms: float) -> dict[str, Any] | None:
    """One interval for the report, its times relative to ``since_ms``."""
    if held is None:
        return None
    return {
        "pool": held.pool,
        "machine_id": held.machine_id,
        "holder": f"{held.dispenser}:{held.pid}",
        "start_ms": round(held.start - since_ms),
        "end_ms": round(held.end - since_ms),
        "stopped": held.stopped,
    }


def not_observed(rows: list[dict[str, Any]]) -> list[int]:
    """Rounds whose lease fault or lease check did not show what it must: a killed
    holder's ID never granted again, a clock step never refused, leases not re-acquired
    after a Redis fault. Each fails the drill."""
    return [
        row["round"]
        for row in rows
        if not row["error"]
        and (
            row.get("regranted") is False
            or row.get("clock_behind_503s") == 0
            or row.get("leases_reacquired") is False
        )
    ]


def _batches_by_worker(
    intervals: list[Interval], batches: list[tuple[float, int]]
) -> dict[str, dict[str, int]]:
    """Batches received per dispenser and worker process: a batch belongs to the holder of
    its machine ID that was granted last before the batch arrived."""
    by_id: dict[int, list[Interval]] = {}
    for held in sorted(intervals, key=lambda h: h.start):
        if held.pool == SNOWFLAKE_TYPE:
            by_id.setdefault(held.machine_id, []).append(held)
    counts: dict[str, Counter[str]] = {}
    for at, machine in batches:
        holders = [h for h in by_id.get(machine, []) if h.start <= at]
        if holders:
            holder = holders[-1]
            counts.setdefault(holder.dispenser, Counter())[str(holder.pid)] += 1
    return {name: dict(c) for name, c in sorted(counts.items())}
