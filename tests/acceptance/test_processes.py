"""Children started by keydispenser_ops.processes.spawn: where their output goes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from keydispenser_ops.processes import spawn

pytestmark = pytest.mark.acceptance

SPEAK = "import sys; sys.stdout.write(sys.stdin.read() + 'out\\n'); sys.stderr.write('err\\n')"


def test_a_logged_child_appends_both_streams_and_reads_no_stdin(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("earlier\n")
    for _ in range(2):
        assert spawn([sys.executable, "-c", SPEAK], output=log).wait(10) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier"
    assert sorted(lines[1:]) == ["err", "err", "out", "out"]
