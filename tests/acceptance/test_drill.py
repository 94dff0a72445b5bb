"""A short failover drill: real primary, replicas and Sentinels, real processes, SIGKILLs.

The full drill (>= 20 rounds, every fault) is `keydispenser drill`; its figures are
in docs/reliability.md. This asserts behaviour only, never speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.ops.processes import run_cli
from tests.conftest import TEST_SECRET

pytestmark = pytest.mark.acceptance

REDIS_FAULTS = [
    "primary_sigkill",
    "sentinel_failover",
    "failback",
    "cut_links_then_sigkill",
    "restart_from_old_snapshot",
]


FAULTS = [*REDIS_FAULTS, "postgres_failover", "kill_keysync"]


def test_no_key_is_dispensed_twice_through_failovers(tmp_path: Path) -> None:
    """The drill runs its own Redis and PostgreSQL pairs: it kills and promotes them."""
    report_path = tmp_path / "drill.json"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "KD_PERMUTATION_KEY": TEST_SECRET}
    done = run_cli(
        "drill",
        "--rounds",
        str(len(FAULTS)),
        "--faults",
        ",".join(FAULTS),
        "--json",
        str(report_path),
        env=env,
        timeout_s=480,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["duplicates"] == 0
    assert report["keys_dispensed"] > 0  # how many depends on speed: never asserted
    assert report["rounds"] == len(FAULTS)
    assert report["process_exits"] == []
    assert report["faults_not_injected"] == 0, report["faults"]
    assert all(row["resume_ms"] >= 0 for row in report["faults"]), report["faults"]
    # The fence engaged: a promoted or restarted primary discarded what it inherited.
    assert sum(row["keys_discarded"] for row in report["faults"]) > 0
    # PostgreSQL failed over to a replica that had missed commits while keys flowed:
    # the PostgreSQL fence discarded its cold inventory.
    (failover,) = [row for row in report["faults"] if row["fault"] == "postgres_failover"]
    assert failover["keys_in_lag_window"] > 0, failover
    assert failover["postgres_keys_discarded"] > 0, failover
    # The ledger never saw a key issued twice. It misses the entries a dying Redis
    # primary had not replicated and the rows a promoted PostgreSQL replica lost.
    ledger = report["ledger"]
    assert ledger["duplicate_alarms"] == 0
    assert ledger["rows"] > 0.8 * report["unique_keys"], ledger
