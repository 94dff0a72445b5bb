"""Every Redis key name and every script key list is built from the namespace."""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from shared.domain import redis_keys
from shared.stores.redis import scripts as redis_scripts


def builders(module: Any, suffix: str) -> list[Callable[..., Any]]:
    return [
        f
        for name, f in inspect.getmembers(module, inspect.isfunction)
        if f.__module__ == module.__name__ and name.endswith(suffix)
    ]


def call(builder: Callable[..., Any], namespace: str) -> Any:
    """``builder`` with ``namespace`` first and a placeholder for every other argument."""
    params = list(inspect.signature(builder).parameters)
    return builder(namespace, *(f"x{i}" for i in range(len(params) - 1)))


@pytest.mark.parametrize("builder", builders(redis_keys, "_key"), ids=lambda f: f.__name__)
def test_every_key_name_takes_the_namespace_first_and_starts_with_it(
    builder: Callable[..., str],
) -> None:
    assert next(iter(inspect.signature(builder).parameters)) == "namespace"
    assert call(builder, "env-a").startswith("env-a:")
    assert call(builder, "kd") != call(builder, "env-a")


SCRIPT_KEYS = [*builders(redis_scripts, "_keys"), redis_scripts.fence_slots]


@pytest.mark.parametrize("builder", SCRIPT_KEYS, ids=lambda f: f.__name__)
def test_every_script_key_list_is_in_its_namespace(builder: Callable[..., list[str]]) -> None:
    keys = call(builder, "env-a")
    assert keys and all(k.startswith("env-a:") for k in keys)


def test_every_public_function_of_the_key_module_is_a_key_builder() -> None:
    """A key function added without the ``_key`` suffix would escape the tests above."""
    public = [n for n in vars(redis_keys) if n[0] != "_" and n not in ("annotations", "hashlib")]
    functions = [n for n in public if inspect.isfunction(getattr(redis_keys, n))]
    functions.remove("namespace_pattern")  # the pattern of them all (below)
    assert functions and all(name.endswith("_key") for name in functions)


@pytest.mark.parametrize("builder", builders(redis_keys, "_key"), ids=lambda f: f.__name__)
def test_the_namespace_pattern_matches_every_key_of_its_namespace_only(
    builder: Callable[..., str],
) -> None:
    """Benches remove what they made by this pattern: it must reach every key."""
    assert fnmatch.fnmatchcase(call(builder, "env-a"), redis_keys.namespace_pattern("env-a"))
    assert not fnmatch.fnmatchcase(call(builder, "env-a"), redis_keys.namespace_pattern("env"))
    assert not hasattr(redis_keys, "PREFIX")  # no module-level namespace
