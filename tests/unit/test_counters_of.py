"""The inverse of generation: which counter a key comes from (what an import excludes)."""

from __future__ import annotations

import pytest

from shared.domain.config import IdTypeConfig
from shared.domain.idtypes import IdType

SECRET = b"unit-secret"

TYPES = [
    {"kind": "numeric", "length": 6},
    {"kind": "numeric", "length": 10, "filter_profile": "mosip"},
    {"kind": "numeric", "length": 22},
    {"kind": "numeric", "length": 7, "order": "sequential", "prefix": "FAR-"},
    {"kind": "base62", "length": 4},
    {"kind": "crockford32", "length": 6, "suffix": "-X"},
]


@pytest.mark.parametrize("settings", TYPES, ids=lambda s: f"{s['kind']}{s['length']}")
def test_every_generated_key_names_its_counter(settings: dict[str, object]) -> None:
    id_type = IdType("t", IdTypeConfig(**settings), SECRET)  # type: ignore[arg-type]
    start = min(12_345, id_type.domain_size // 3)
    keys, _ = id_type.generate(start, start + 20_000)
    assert keys
    counters = id_type.counters_of(keys)
    assert all(c is not None and start <= c < start + 20_000 for c in counters)
    some = [c for c in counters if c is not None][:200]
    assert [id_type.generate(c, c + 1)[0] for c in some] == [[k] for k in keys[:200]]


def test_a_key_no_counter_generates_has_none() -> None:
    long_type = IdType("t", IdTypeConfig(kind="numeric", length=22), SECRET)
    key = long_type.generate(0, 20_000)[0][0]
    foreign = ("9" if key[0] != "9" else "8") + key[1:]  # another head: not this tail's
    assert long_type.counters_of([foreign]) == [None]
    padded = IdType(
        "s", IdTypeConfig(kind="numeric", length=6, order="sequential", check_digit="none"), SECRET
    )
    assert padded.counters_of(["000042"]) == [42]
