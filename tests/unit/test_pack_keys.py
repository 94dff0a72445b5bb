"""push.lua receives a batch as one newline-joined argument."""

from __future__ import annotations

import pytest

from shared.stores.hot.hot_store import pack_keys


def test_keys_are_joined_by_newlines() -> None:
    assert pack_keys(["a", "b", "c"]) == "a\nb\nc"
    assert pack_keys([]) == ""


@pytest.mark.parametrize("keys", [["a\nb"], ["a", ""], ["", "b"]])
def test_a_key_that_would_split_or_vanish_is_refused(keys: list[str]) -> None:
    with pytest.raises(ValueError):
        pack_keys(keys)
