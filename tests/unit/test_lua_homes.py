"""Each mechanism keeps its Lua in its own package: a script is found by its name alone,
so no two packages may hold one of the same name; every script is declared once (a
``Script`` in a module of its mechanism, beside the adapter that calls it), and found
with what runs before it."""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from importlib import resources

import pytest

from shared.stores.redis import scripts
from shared.stores.redis.scripts import Script


def _names() -> list[str]:
    return [
        entry.name.removesuffix(".lua")
        for home in scripts.LUA_HOMES
        for entry in resources.files(home).joinpath("lua").iterdir()
        if entry.name.endswith(".lua")
    ]


def _declarations() -> list[tuple[str, Script]]:
    """Every ``Script`` a module of a mechanism declares, with where."""
    found = []
    for home in scripts.LUA_HOMES:
        package = importlib.import_module(home)
        for module in pkgutil.iter_modules(package.__path__, f"{home}."):
            loaded = importlib.import_module(module.name)
            for attr, value in vars(loaded).items():
                if isinstance(value, Script) and not attr.startswith("_"):
                    found.append((f"{module.name}.{attr}", value))
    return found


DECLARED = {script.name: script for _, script in _declarations()}


def test_no_two_mechanisms_hold_a_script_of_one_name() -> None:
    assert [name for name, n in Counter(_names()).items() if n > 1] == []


def test_no_script_is_declared_twice() -> None:
    """One declaration per script: a second could say otherwise of its keys or fence."""
    names = Counter(script.name for _, script in _declarations())
    assert [name for name, n in names.items() if n > 1] == []


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_every_declared_script_is_found_with_what_runs_before_it(name: str) -> None:
    declared, own = DECLARED[name], scripts.load_script(name)
    body = declared.body()
    assert body.endswith(own)
    assert body.startswith(scripts.load_script("fence")) == declared.fenced


def test_every_script_file_is_declared_or_a_helper() -> None:
    """A new .lua file must be declared: how its keys are built and whether the fence
    runs before it (a required field: none is fenced, or not, by default)."""
    helpers = {*scripts.PROLOGUE, "lease"}
    assert set(_names()) - helpers == set(DECLARED)
    assert not set(DECLARED) & helpers


def test_a_script_in_no_mechanism_is_named_in_the_error() -> None:
    with pytest.raises(FileNotFoundError, match="no Lua script 'nowhere'"):
        scripts.load_script("nowhere")
