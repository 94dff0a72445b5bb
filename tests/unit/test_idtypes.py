from __future__ import annotations

import pytest

from shared.checkdigit import verhoeff_digit, verhoeff_valid
from shared.errors import ConfigError, InvalidInput
from shared.filters import rejected_by
from shared.idtypes import IdType
from shared.settings import BASE62_ALPHABET, IdTypeConfig

SECRET = b"unit-secret"


def numeric(length: int = 10, **extra: object) -> IdType:
    return IdType("farmer", IdTypeConfig(kind="numeric", length=length, **extra), SECRET)  # type: ignore[arg-type]


def test_numeric_keys_are_valid_unique_and_filtered() -> None:
    keys, candidates = numeric().generate(0, 50_000)
    assert candidates == 50_000
    assert 0 < len(keys) < candidates
    assert len(set(keys)) == len(keys)
    for key in keys[:5_000]:
        assert len(key) == 10
        assert verhoeff_valid(key)
        assert rejected_by(key, 10, IdTypeConfig(kind="numeric", length=10).filters) == []


def test_disjoint_ranges_give_disjoint_keys() -> None:
    id_type = numeric()
    first, _ = id_type.generate(0, 30_000)
    second, _ = id_type.generate(30_000, 60_000)
    assert not set(first) & set(second)


def test_generation_is_deterministic_for_a_key() -> None:
    assert numeric().generate(100, 200) == numeric().generate(100, 200)


def test_tiny_keyspace_is_issued_completely() -> None:
    id_type = numeric(length=4, filter_profile="none")
    keys, _ = id_type.generate(0, 10_000)  # past the domain: clipped
    assert len(keys) == 1_000
    assert {k[:3] for k in keys} == {f"{n:03d}" for n in range(1_000)}


def test_base62_keys_have_fixed_length_and_alphabet() -> None:
    id_type = IdType("shortlink", IdTypeConfig(kind="base62", length=7), SECRET)
    keys, candidates = id_type.generate(0, 20_000)
    assert len(keys) == candidates == 20_000
    assert len(set(keys)) == 20_000
    assert all(len(k) == 7 and set(k) <= set(BASE62_ALPHABET) for k in keys)


def test_validate_checks_length_check_digit_and_filters() -> None:
    id_type = numeric()
    assert id_type.validate("3029384756")
    assert not id_type.validate("3029384757")  # wrong check digit
    assert not id_type.validate("302938475")  # wrong length
    filtered = "201356480" + verhoeff_digit("201356480")  # check digit right, '480' all even
    assert verhoeff_valid(filtered)
    assert not id_type.validate(filtered)


def test_validate_refuses_malformed_values() -> None:
    with pytest.raises(InvalidInput):
        numeric().validate("12ab")
    with pytest.raises(InvalidInput):
        numeric().validate("")


def test_generation_needs_the_secret() -> None:
    id_type = IdType("farmer", IdTypeConfig(kind="numeric", length=10), None)
    assert id_type.validate("3029384756")
    with pytest.raises(ConfigError, match="permutation_key"):
        id_type.generate(0, 10)


def test_fingerprint_carries_the_key_digest_not_the_key() -> None:
    print_ = numeric().fingerprint.as_dict()
    assert print_["kind"] == "numeric" and print_["length"] == 10
    assert SECRET.decode() not in str(print_)
    other = IdType("farmer", IdTypeConfig(kind="numeric", length=10), b"other").fingerprint
    assert other.permutation_key_digest != print_["permutation_key_digest"]
