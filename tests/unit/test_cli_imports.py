"""The production command line loads no operator tooling: a benchmark or the drill is
imported only when it runs, and the runtime's command line knows the tooling's commands
only as the plugins it finds (entry points), never by a name of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import shared.cli
from shared.cli.plugins import GROUP

CLI = Path(shared.cli.__file__).parent
# Ways to load a module named in a string.
LOADERS = frozenset({"import_module", "find_spec", "__import__", "spec_from_file_location"})

PROBE = """
import sys
from shared.cli import main as cli
parser = cli.parser()
parser.parse_args(["bench", "keygen"])
parser.parse_args(["drill", "--rounds", "1"])
tooling = ("keydispenser_ops.bench", "keydispenser_ops.drill")
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

    from keydispenser_ops.bench import MODULES
    from keydispenser_ops.catalog import BENCHES

    for name in BENCHES:
        module = importlib.import_module(f"keydispenser_ops.bench.{MODULES.get(name, name)}")
        assert list(inspect.signature(module.run).parameters) == ["settings", "seconds", "options"]


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and its functions."""
    owners = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef))]
    return {
        id(owner.body[0].value)
        for owner in owners
        if owner.body
        and isinstance(owner.body[0], ast.Expr)
        and isinstance(owner.body[0].value, ast.Constant)
    }


def test_the_runtime_cli_names_no_tooling_module_nor_command() -> None:
    """No import of keydispenser_ops, no module loaded by a name in a string, and no string that
    is a tooling command's name (a table keyed by one, an `if command == ...`)."""
    commands = {point.name for point in entry_points(group=GROUP)}
    assert {"up", "fill", "bench", "drill"} <= commands  # the check below has names to miss
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("keydispenser_ops") for a in node.names), path
            elif isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("keydispenser_ops"), path
                assert not {a.name for a in node.names} & LOADERS, path
            elif isinstance(node, ast.Attribute | ast.Name):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                assert name not in LOADERS, f"{path}:{node.lineno} loads a module by name"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in skip:
                    continue
                assert "keydispenser_ops" not in node.value, f"{path}:{node.lineno}"
                assert node.value not in commands, f"{path}:{node.lineno} {node.value!r}"
