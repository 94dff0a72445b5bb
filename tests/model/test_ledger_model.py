"""The ledger's protocol as a model (tests/model/ledger.pml), checked with SPIN.

Every workload is explored exhaustively (every interleaving of its actions, within
its bounds: ledger.pml says them) and must hold on the design the code implements;
each of round 4's three behaviours must be found again by its variant, with the
invariant it breaks. docs/reliability.md ("The ledger's one history") maps the model
to the code.

SPIN (Debian's ``spin``) and a C compiler must be on PATH; without them this skips,
unless ``KD_TEST_REQUIRE_MODEL=1`` (set by .ci/run), which makes a missing tool a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

MODEL = Path(__file__).with_name("ledger.pml")
COMPILE = ["gcc", "-w", "-O2", "-DSAFETY", "-DCOLLAPSE", "-DMEMLIM=8000", "-DVECTORSZ=4096"]
SEARCH = ["-m200000", "-w26"]  # depth bound far above every workload's; 2^26 hash slots
RUN_DEADLINE_S = 600

pytestmark = pytest.mark.model


@dataclass(frozen=True)
class Verdict:
    errors: int
    states: int
    complete: bool  # the whole state space was searched
    violated: str  # the first assertion that failed ("" when none)
    output: str


def check(*defines: str) -> Verdict:
    """Compile the model with ``defines`` (-D...) and search its whole state space."""
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("KD_TEST_REQUIRE_MODEL") == "1":
            pytest.fail(f"the model checker needs {', '.join(missing)} on PATH")
        pytest.skip(f"{', '.join(missing)} not on PATH (Debian: apt-get install spin gcc)")
    with tempfile.TemporaryDirectory(prefix="kd-model-") as tmp:
        work = Path(tmp)
        shutil.copy(MODEL, work / MODEL.name)
        flags = [f"-D{d}" for d in defines]
        subprocess.run(
            ["spin", "-a", *flags, MODEL.name], cwd=work, check=True, capture_output=True
        )
        subprocess.run([*COMPILE, "-o", "pan", "pan.c"], cwd=work, check=True, capture_output=True)
        ran = subprocess.run(
            ["./pan", *SEARCH], cwd=work, capture_output=True, text=True, timeout=RUN_DEADLINE_S
        )
    out = ran.stdout + ran.stderr
    errors = re.search(r"errors: (\d+)", out)
    states = re.search(r"(\d+) states, stored", out)
    violated = re.search(r"assertion violated (.*?) \(at depth", out)
    complete = "max search depth too small" not in out and "out of memory" not in out.lower()
    return Verdict(
        int(errors.group(1)) if errors else -1,
        int(states.group(1)) if states else 0,
        complete,
        violated.group(1) if violated else "",
        out,
    )


@pytest.mark.parametrize(
    "workload", ["W_PAIR", "W_REISSUE", "W_QUIET", "W_TWICE", "W_REDIS", "W_MIXED"]
)
def test_the_design_holds_on_every_interleaving(workload: str) -> None:
    found = check(workload)
    assert found.errors == 0, found.output
    assert found.complete and found.states > 0, found.output


# Round 4's mechanism each variant puts back, the workload that shows it, and the
# invariant its counterexample breaks (a fragment of SPIN's "assertion violated").
ROUND_4 = {
    # 1. A replay revives a release: the lost batches decided again (their requeue
    # lost with them) put the key back while its next client holds it.
    "replay_revives_a_release": (("REPLAY_REDECIDES", "W_REISSUE"), "hold[u]!=1"),
    # 2. A quiet spell after a promotion: the ledger answers before the restore (which
    # waits for the next batch, trimmed by then): an acknowledged UIN is not found.
    "quiet_spell_loses_what_was_answered": (("REPLAY_AFTER_NEXT_BATCH", "W_QUIET"), "outc[e]!=4"),
    # 3. Two keysyncs: a replay decides again, in stream order, what was decided in
    # commit order: a repeated PUT is told the opposite of its first answer.
    "replay_reverses_a_decision": (("REPLAY_REDECIDES", "W_PAIR"), "truth[eiss[e]]!="),
}


@pytest.mark.parametrize("name", sorted(ROUND_4))
def test_round_4s_design_is_found_wrong(name: str) -> None:
    defines, invariant = ROUND_4[name]
    found = check("ANSWERS_ONLY", *defines)
    assert found.errors > 0, found.output
    assert invariant in found.violated, found.output


# What else the model found, kept as variants: each mechanism of the design, taken out.
MECHANISMS = {
    # A promoted server's ledger decides only once the record follows its timeline:
    # otherwise a stamp of the old primary landing late leaves a decision made on a
    # history lacking what was answered.
    "any_timeline": (("ANY_TIMELINE", "W_PAIR"), "truth[eiss[e]]!="),
    # The log entry is written before the commit: written after, a keysync that dies
    # in between leaves a link a later restore cannot find (a needless halt).
    "log_after_commit": (("LOG_AFTER_COMMIT", "W_PAIR"), "b_trim<"),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_each_mechanism_is_needed(name: str) -> None:
    defines, invariant = MECHANISMS[name]
    found = check(*defines)
    assert found.errors > 0, found.output
    assert invariant in found.violated, found.output
