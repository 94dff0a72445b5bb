"""The three process packages never import one another; shared imports none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = ("keygen", "keysync", "dispenser")


def imported_packages(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", PROCESSES)
def test_process_packages_do_not_import_each_other(package: str) -> None:
    others = set(PROCESSES) - {package}
    assert not imported_packages(package) & others


def test_shared_does_not_import_process_packages() -> None:
    assert not imported_packages("shared") & set(PROCESSES)
