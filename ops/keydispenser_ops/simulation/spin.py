"""The mirror and the model agree: a trace of the mirror's steps, replayed by SPIN on
tests/model/ledger.pml (its REPLAY mode: each step must be the action the trace names,
its condition holding, no assertion failing), must end where the mirror's does.

``walk`` draws a trace from the mirror (random actions among those it enables); the
model's driver replays such walks, and the simulation's traces, and fails on any
disagreement: a step one accepts and the other refuses, or an invariant one of them
breaks and the other does not.
"""

from __future__ import annotations

import copy
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from keydispenser_ops.simulation.mirror import (
    ACTIONS,
    LOST,
    REL,
    UNREAD,
    USE,
    Mirror,
    NotAnAction,
    Violation,
    params,
)

Step = tuple[str, int, int]  # an action's name, and its two parameters (0: unused)
# The model's bounds in its REPLAY world (ledger.pml: MAXE, MAXN).
MAX_ENTRIES = 7
MAX_NODES = 17
DEADLINE_S = 300


def find_model() -> Path:
    """tests/model/ledger.pml of the checkout this runs from."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        found = parent / "tests" / "model" / "ledger.pml"
        if found.is_file():
            return found
    raise FileNotFoundError("tests/model/ledger.pml (the model runs from a checkout)")


def trace_pml(steps: list[Step]) -> str:
    """trace.pml: NSTEPS and init_trace(), which fills the trace's arrays."""
    n = max(len(steps), 1)
    lines = [
        f"#define NSTEPS {len(steps)}",
        f"byte tcode[{n}];",
        f"byte tp1[{n}];",
        f"byte tp2[{n}];",
        "inline init_trace() {",
    ]
    for i, (action, p1, p2) in enumerate(steps):
        lines.append(f"  tcode[{i}] = {ACTIONS[action]}; tp1[{i}] = {p1}; tp2[{i}] = {p2};")
    lines.append("  skip")
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Replayed:
    steps: int  # steps SPIN took
    violated: str  # the assertion that failed ("" none)
    output: str

    @property
    def whole(self) -> bool:
        return not self.violated and f"REPLAYED {self.steps}" in self.output

    def digest(self) -> list[str]:
        """The model's state at the end, as it printed it (STATE and HERE lines)."""
        return [
            line.strip()
            for line in self.output.splitlines()
            if line.strip().startswith(("STATE ", "HERE "))
        ]


def replay(steps: list[Step], model: Path | None = None) -> Replayed:
    """Replay ``steps`` in SPIN (its simulation: one path, the trace's)."""
    if shutil.which("spin") is None:
        raise FileNotFoundError("spin (Debian: apt-get install spin)")
    with tempfile.TemporaryDirectory(prefix="kd-replay-") as tmp:
        work = Path(tmp)
        shutil.copy(model or find_model(), work / "ledger.pml")
        (work / "trace.pml").write_text(trace_pml(steps))
        ran = subprocess.run(
            ["spin", "-DW_REPLAY", "-DREPLAY", "ledger.pml"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    out = ran.stdout + ran.stderr
    taken = [int(m) for m in re.findall(r"STEP (\d+)", out)]
    # spin: "Error: assertion violated", then "text of failed assertion: assert(...)"
    failed = re.search(r"text of failed assertion: (.*)", out)
    violated = failed.group(1) if failed else ("assertion" if "assertion violated" in out else "")
    return Replayed(max(taken, default=0), violated, out)


def mirror_of(steps: list[Step], keysyncs: int = 2) -> Mirror | None:
    """The mirror after ``steps`` (None when one of them is not the model's)."""
    mirror = Mirror.of_simulation(keysyncs)
    try:
        for step in steps:
            call(mirror, step)
    except (NotAnAction, Violation):
        return None
    return mirror


def fits(mirror: Mirror) -> bool:
    """Within the replay world's bounds (ledger.pml: entries 1..MAXE-1, nodes
    0..MAXN-1)."""
    return mirror.ne <= MAX_ENTRIES + 1 and mirror.nn <= MAX_NODES + 1


# --- walks of the mirror -------------------------------------------------------------


def candidates(mirror: Mirror) -> Iterator[Step]:
    """Every step worth trying from here (the mirror says which it takes)."""
    clients, keysyncs = range(1, mirror.ncl + 1), range(1, mirror.nks + 1)
    for c in clients:
        yield ("pop", c, 0)
        yield ("put_begin", c, USE)
        yield ("put_begin", c, REL)
        yield ("put_caught", c, 0)
        yield ("put_append", c, 0)
        yield ("look_record", c, 0)
        yield ("look_snapshot", c, 0)
        yield ("look_snapshot", c, 1)
        yield ("look_answer", c, 0)
        yield ("look_answer", c, 1)
        yield ("retry", c, 0)
        yield ("abandon", c, 0)
    for e in range(1, mirror.ne):
        yield ("answer", e, 0)
        yield ("give_up", e, 0)
    for k in keysyncs:
        yield ("read", k, 1)
        yield ("read", k, 2)
        for action in (
            "claim",
            "begin",
            "commit",
            "confirm",
            "crash",
            "drop",
            "take_begin",
            "take",
            "push",
        ):
            yield (action, k, 0)
        yield ("drop", k, 1)
        yield ("read", k, 3)
        for action in ("rq_begin", "rq_commit", "rs_begin", "restore"):
            yield (action, k, 0)
        yield ("rq_commit", k, 1)
        for n in range(1, mirror.nn):
            if mirror.onchain(n) and not (mirror.rto or mirror.here.pto):
                yield ("rs_begin", k, n)
    yield ("fence", 0, 0)
    yield ("adopt", 0, 0)
    yield ("trim", 0, 0)
    yield ("vouch", 0, 0)
    yield ("vouch_commit", 0, 0)
    for n in range(1, mirror.nn):
        if mirror.nodes[n].isvouch:
            yield ("vouch", n, 0)
    for kind, lost in ((1, 0), (1, 1), (1, 8), (1, 16), (1, 6), (2, 0), (3, 9), (4, 0)):
        yield ("rloss", kind, lost)
    for e in range(1, mirror.ne):
        for state in (LOST, UNREAD, 3, 4):
            yield ("loss_entry", e, state)
        yield ("loss_outcome", e, 0)
    for n in range(1, mirror.nn):
        yield ("loss_link", n, 0)
    yield ("loss_restore", 0, 0)
    yield ("loss_restore", 1, 0)
    yield ("loss_end", 0, 0)
    node, ancestors = mirror.srv, []
    while node:
        ancestors.append(node)
        node = mirror.nodes[node].par
    for target in [*ancestors[:3], 0]:
        yield ("promote", target, 0)


def call(mirror: Mirror, step: Step) -> None:
    """The mirror's method for a step, with the parameters it takes."""
    action, p1, p2 = step
    mirror.step(action, *params(action, p1, p2))


# Faults are rarer than the protocol's own steps in a walk (each fault a few times).
RARE = {
    "rq_begin": 0.3,
    "promote": 0.08,
    "rloss": 0.05,
    "crash": 0.15,
    "drop": 0.1,
    "claim": 0.3,
    "trim": 0.3,
    "give_up": 0.05,
    "abandon": 0.05,
    "loss_entry": 0.3,
    "loss_outcome": 0.3,
    "loss_link": 0.3,
    "vouch_commit": 0.3,
}


def walk(seed: int, length: int = 120) -> tuple[list[Step], str, Mirror]:
    """A random trace the mirror accepts; the invariant it broke at its end ("": none;
    a walk stops at the first violation); the mirror after it."""
    rng = random.Random(seed)
    mirror = Mirror()
    steps: list[Step] = []
    while len(steps) < length:
        if mirror.ne > MAX_ENTRIES or mirror.nn > MAX_NODES - 1:
            break
        options = []
        for step in candidates(mirror):
            if rng.random() > RARE.get(step[0], 1.0):
                continue
            trial = copy.deepcopy(mirror)
            try:
                call(trial, step)
            except NotAnAction:
                continue
            except Violation as exc:
                options.append((step, trial, str(exc)))
                continue
            options.append((step, trial, ""))
        if not options:
            break
        step, mirror, violated = rng.choice(options)
        steps.append(step)
        if violated:
            return steps, violated, mirror
    return steps, "", mirror
