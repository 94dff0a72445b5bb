"""Every named mutant still applies: its line is in its file exactly once. A refactor
that moves or rewrites a guarded line must move its mutant with it, or the mutant run
would report it "not applied" and the hazard it stands for would go unchecked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_the_mutant_applies_once(mutant: Mutant) -> None:
    assert (ROOT / mutant.path).read_text().count(mutant.before) == 1
    assert all((ROOT / test.split("::")[0]).exists() for test in mutant.tests)


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
