"""Each mechanism keeps its Lua in its own package: a script is found by its name alone,
so no two packages may hold one of the same name; every script is declared once
(``scripts.SCRIPTS``), and found with what runs before it."""

from __future__ import annotations

from collections import Counter
from importlib import resources

import pytest

from shared.stores.redis import scripts


def _names() -> list[str]:
    return [
        entry.name.removesuffix(".lua")
        for home in scripts.LUA_HOMES
        for entry in resources.files(home).joinpath("lua").iterdir()
        if entry.name.endswith(".lua")
    ]


def test_no_two_mechanisms_hold_a_script_of_one_name() -> None:
    assert [name for name, n in Counter(_names()).items() if n > 1] == []


@pytest.mark.parametrize("script", sorted(scripts.SCRIPTS))
def test_every_declared_script_is_found_with_what_runs_before_it(script: str) -> None:
    declared, own = scripts.SCRIPTS[script], scripts.load_script(script)
    body = declared.body(script)
    assert body.endswith(own)
    assert body.startswith(scripts.load_script("fence")) == declared.fenced


def test_every_script_file_is_declared_or_a_helper() -> None:
    """A new .lua file must say, in SCRIPTS, how its keys are built and whether the
    fence runs before it: none is fenced (or not) by default."""
    helpers = {*scripts.PROLOGUE, "lease"}
    assert set(_names()) - helpers == set(scripts.SCRIPTS)


def test_a_script_in_no_mechanism_is_named_in_the_error() -> None:
    with pytest.raises(FileNotFoundError, match="no Lua script 'nowhere'"):
        scripts.load_script("nowhere")
