"""The inverse of generation: which counter a key comes from (what an import excludes)."""

from __future__ import annotations

import random

import pytest

from shared.domain.config import IdTypeConfig
from shared.domain.errors import InvalidInput
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


@pytest.mark.parametrize("settings", TYPES, ids=lambda s: f"{s['kind']}{s['length']}")
def test_keys_of_a_block_agree_with_validate_one_by_one(settings: dict[str, object]) -> None:
    id_type = IdType("t", IdTypeConfig(**settings), SECRET)  # type: ignore[arg-type]
    generated, _ = id_type.generate(0, 20_000)
    rnd = random.Random(7)
    alphabet = id_type.format.read_characters
    affix = str(settings.get("prefix", "")), str(settings.get("suffix", ""))
    values = [*generated[:300], "", " ", "x" * 300, generated[0].lower(), f" {generated[1]} "]
    for _ in range(2_000):
        size = id_type.config.length + rnd.choice((0, 0, 0, 1, -1))
        values.append(affix[0] + "".join(rnd.choice(alphabet) for _ in range(size)) + affix[1])

    def one(value: str) -> str | None:
        try:
            return id_type.normalise(value.strip()) if id_type.validate(value.strip()) else None
        except InvalidInput:
            return None

    assert id_type.keys_of(values) == [one(v) for v in values]
