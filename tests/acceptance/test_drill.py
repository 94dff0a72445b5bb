"""A short failover drill: real primary, replicas and Sentinels, real processes, SIGKILLs.

The full drill (>= 20 rounds, every fault) is `keydispenser drill`; its figures are
in docs/reliability.md. This asserts behaviour only, never speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.ops.processes import run_cli
from tests.conftest import TEST_SECRET, Servers

pytestmark = pytest.mark.acceptance

REDIS_FAULTS = [
    "primary_sigkill",
    "sentinel_failover",
    "failback",
    "cut_links_then_sigkill",
    "restart_from_old_snapshot",
]


def test_no_key_is_dispensed_twice_through_failovers(servers: Servers, tmp_path: Path) -> None:
    report_path = tmp_path / "drill.json"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "KD_POSTGRES_DSN": servers.postgres_admin_dsn,
        "KD_PERMUTATION_KEY": TEST_SECRET,
    }
    done = run_cli(
        "drill",
        "--rounds",
        str(len(REDIS_FAULTS) + 1),
        "--faults",
        ",".join([*REDIS_FAULTS, "kill_keysync"]),
        "--json",
        str(report_path),
        env=env,
        timeout_s=480,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["duplicates"] == 0
    assert report["keys_dispensed"] > 10_000
    assert report["rounds"] == len(REDIS_FAULTS) + 1
    assert report["faults_not_injected"] == 0, report["faults"]
    assert all(row["resume_ms"] >= 0 for row in report["faults"]), report["faults"]
    # The fence engaged: a promoted or restarted primary discarded what it inherited.
    assert sum(row["keys_discarded"] for row in report["faults"]) > 0
    # The ledger kept up through every fault and never saw a key issued twice; it may
    # miss the few entries a dying primary had not replicated.
    ledger = report["ledger"]
    assert ledger["duplicate_alarms"] == 0
    assert ledger["rows"] > 0.95 * report["unique_keys"], ledger
