"""The production command line loads no operator tooling: a benchmark or the drill is
imported only when it runs."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from shared.cli import main as cli
parser = cli.parser()
parser.parse_args(["bench", "keygen"])
parser.parse_args(["drill", "--rounds", "1"])
tooling = ("shared.ops.bench", "shared.ops.drill")
print(",".join(sorted(m for m in sys.modules if m.startswith(tooling))))
"""


def test_the_cli_and_its_parser_import_no_bench_or_drill_module() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_every_bench_the_cli_offers_is_a_module_with_a_run() -> None:
    import importlib
    import inspect

    from shared.ops.catalog import BENCHES

    for name in BENCHES:
        module = importlib.import_module(f"shared.ops.bench.{name}")
        assert list(inspect.signature(module.run).parameters) == ["settings", "seconds", "options"]
