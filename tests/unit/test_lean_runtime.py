"""The runtime works without the ``ops`` extra: the image installs no embedded servers,
load generators or progress bars, and nothing the three processes run may need them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from shared.ops.cli import OPS_EXTRA

OPS_ONLY = tuple(sorted(OPS_EXTRA))

# Runs in a child: makes the ops-only packages unimportable, as in the image.
PRELUDE = textwrap.dedent(
    f"""
    import sys
    for name in {OPS_ONLY!r}:
        sys.modules[name] = None  # 'import name' now raises ImportError
    """
)


def run_without_ops(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_three_processes_and_the_cli_import_without_ops() -> None:
    done = run_without_ops(
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
    """Control: the prelude does make an ops-only package unimportable."""
    done = run_without_ops("import aiohttp")
    assert done.returncode != 0
    assert "ImportError" in done.stderr or "ModuleNotFoundError" in done.stderr


def test_operator_tooling_without_ops_names_the_extra() -> None:
    done = run_without_ops(
        """
        import os
        from shared.cli import main as cli
        os.environ["KD_POSTGRES_DSN"] = "postgresql://nobody@127.0.0.1:1/none"
        os.environ["KD_REDIS_URL"] = "redis://127.0.0.1:1/0"
        os.environ["KD_CONFIG"] = "builtin"
        cli.main(["fill", "--type", "farmer", "--count", "1"])
        """
    )
    assert done.returncode == 1
    assert "needs the ops extra (tqdm is missing)" in done.stderr
    assert "keydispenser[ops]" in done.stderr
    assert "Traceback" not in done.stderr


def test_without_the_tooling_its_commands_say_where_they_live() -> None:
    """The wheel and the image leave shared.ops out but keep its entry points: `up`,
    `fill`, `bench` and `drill` are listed, and say where to run them, before any setting
    is read."""
    done = run_without_ops(
        """
        import sys
        sys.modules["shared.ops"] = None  # as in the wheel: no operator tooling at all
        from shared.cli import main as cli
        print(" ".join(cli.parser().format_help().split()))
        assert "shared.ops" not in {m for m in sys.modules if sys.modules[m] is not None}
        cli.main(["--config", "nowhere.yaml", "fill", "--type", "farmer", "--count", "1"])
        """
    )
    assert done.returncode == 1, done.stderr
    assert "keydispenser fill: operator tooling" in done.stderr and "checkout" in done.stderr
    assert "pip install -e '.[ops]'" in done.stderr
    assert "Traceback" not in done.stderr
    for name in ("up", "fill", "bench", "drill"):
        assert f" {name} operator tooling, not installed here" in done.stdout
