"""The dispenser loads none of the PostgreSQL fence's procedure. keygen and keysync run
the fence (``postgres_fence.settle``, behind ``guarded.GuardedCold``); the dispenser only
judges its ledger reads by the fence's verdict (``fence.verdict``). A value type the
fence reports (``FenceReport``) lives in the domain, so that the metrics every process
shares do not pull the procedure into the dispenser. Checked by the modules a fresh
interpreter has loaded, through every path an import may take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE_PROCEDURE = ("shared.stores.fence.postgres_fence", "shared.stores.fence.guarded")
MARK = "loaded:"


def fence_procedure_loaded_by(module: str) -> set[str]:
    """Which of FENCE_PROCEDURE a fresh interpreter has imported after ``module``."""
    report = f"print({MARK!r} + ','.join(n for n in {FENCE_PROCEDURE!r} if n in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", f"import sys\nimport {module}\n{report}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(MARK), done.stdout
    return set(filter(None, line.removeprefix(MARK).split(",")))


@pytest.mark.parametrize("module", ["dispenser.app", "dispenser.main", "shared.metrics"])
def test_the_dispenser_loads_no_fence_procedure(module: str) -> None:
    assert fence_procedure_loaded_by(module) == set()


@pytest.mark.parametrize("module", ["keysync.main", "keygen.main"])
def test_the_processes_that_fence_load_it(module: str) -> None:
    """Control: the probe sees the procedure where it is loaded."""
    assert fence_procedure_loaded_by(module) == set(FENCE_PROCEDURE)
