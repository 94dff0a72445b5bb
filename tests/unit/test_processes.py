"""How children are started: their command line and their environment."""

from __future__ import annotations

import sys

import pytest

from keydispenser_ops.processes import cli_command, scrubbed_env


def test_the_cli_runs_under_this_interpreter() -> None:
    assert cli_command("migrate", "--help") == [
        sys.executable,
        "-m",
        "shared.cli",
        "migrate",
        "--help",
    ]


def test_a_child_gets_no_kd_variable_but_the_ones_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KD_REDIS_URL", "redis://operator-shell:6379/0")
    monkeypatch.setenv("KD_DISPENSER__PORT", "9999")
    monkeypatch.setenv("KEEP_ME", "yes")
    env = scrubbed_env(KD_CONFIG="/tmp/c.yaml")
    assert {k: v for k, v in env.items() if k.startswith("KD_")} == {"KD_CONFIG": "/tmp/c.yaml"}
    assert env["KEEP_ME"] == "yes"
