"""Each mechanism keeps its Lua in its own package: a script is found by its name alone,
so no two packages may hold one of the same name, and every script the stores call is
there, with the fence's prologue it is run behind."""

from __future__ import annotations

from collections import Counter
from importlib import resources

import pytest

from shared.stores.redis import scripts

# Every script a store calls by name (``_run``/``_run_acked``/``_run_on_line``).
CALLED = (
    "pop", "pop_idempotent", "push", "depth", "nudge",
    "read_record", "record_lease", "reset_record", "vouch_record", "bind_record",
    "confirm_record", "halt_record",
    "ledger_ack", "forget_consumer",
    "lease_acquire", "lease_renew", "lease_release", "lease_holders",
)  # fmt: skip


def _names() -> list[str]:
    return [
        entry.name.removesuffix(".lua")
        for home in scripts.LUA_HOMES
        for entry in resources.files(home).joinpath("lua").iterdir()
        if entry.name.endswith(".lua")
    ]


def test_no_two_mechanisms_hold_a_script_of_one_name() -> None:
    assert [name for name, n in Counter(_names()).items() if n > 1] == []


@pytest.mark.parametrize("script", CALLED)
def test_every_called_script_is_found_with_the_fence_before_it(script: str) -> None:
    own = scripts.load_script(script)
    if script in scripts.UNFENCED:
        return  # run as it is (the stream and the wake list carry no fence)
    body = scripts.fenced_script(script)
    assert body.endswith(own) and body.startswith(scripts.load_script("fence"))


def test_a_script_in_no_mechanism_is_named_in_the_error() -> None:
    with pytest.raises(FileNotFoundError, match="no Lua script 'nowhere'"):
        scripts.load_script("nowhere")
