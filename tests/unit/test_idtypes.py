from __future__ import annotations

import numpy as np
import pytest

from shared.domain.checkdigit import verhoeff_digit, verhoeff_valid
from shared.domain.config import IdTypeConfig
from shared.domain.errors import ConfigError, InvalidInput
from shared.domain.filters import rejected_by
from shared.domain.formats.base62 import ALPHABET as BASE62_ALPHABET
from shared.domain.idtypes import IdType

SECRET = b"unit-secret"


def numeric(length: int = 10, **extra: object) -> IdType:
    return IdType("farmer", IdTypeConfig(kind="numeric", length=length, **extra), SECRET)  # type: ignore[arg-type]


def slow_reference(id_type: IdType, start: int, stop: int) -> list[str]:
    """Generation written the obvious way: permute, format, check digit, scalar filters."""
    assert id_type._permutation is not None
    values = id_type._permutation.permute(np.arange(start, stop, dtype=np.uint64))
    width = id_type.config.length - 1
    out = []
    for value in values:
        body = f"{int(value):0{width}d}"
        key = body + verhoeff_digit(body)
        if not rejected_by(key, id_type.rules):
            out.append(key)
    return out


@pytest.mark.parametrize(
    ("length", "profile"),
    [
        (10, "openg2p"),
        (10, "mosip"),
        (12, "openg2p"),
        (7, "mosip"),
        (16, "openg2p"),
        (19, "mosip"),
        (4, "none"),
        (6, "openg2p"),
    ],
)
def test_fast_generation_equals_the_obvious_one(length: int, profile: str) -> None:
    id_type = numeric(length, filter_profile=profile)
    stop = min(id_type.domain_size, 20_000)
    assert id_type.generate(0, stop)[0] == slow_reference(id_type, 0, stop)


def test_numeric_keys_are_valid_unique_and_filtered() -> None:
    id_type = numeric()
    keys, candidates = id_type.generate(0, 50_000)
    assert candidates == 50_000
    assert 0 < len(keys) < candidates
    assert len(set(keys)) == len(keys)
    assert all(len(k) == 10 and id_type.validate(k) for k in keys)


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


@pytest.mark.parametrize(("length", "profile"), [(20, "openg2p"), (24, "mosip"), (32, "none")])
def test_long_numeric_types_generate(length: int, profile: str) -> None:
    id_type = numeric(length, filter_profile=profile)
    assert id_type.domain_size == 10**18
    keys, _ = id_type.generate(10**17, 10**17 + 200_000)
    assert keys and len(set(keys)) == len(keys)
    assert all(len(k) == length and id_type.validate(k) for k in keys)
    assert len({k[0] for k in keys}) > 1 or profile != "none"  # heads vary


def test_base62_keys_have_fixed_length_and_alphabet() -> None:
    id_type = IdType("shortlink", IdTypeConfig(kind="base62", length=7), SECRET)
    keys, candidates = id_type.generate(0, 20_000)
    assert len(keys) == candidates == 20_000
    assert len(set(keys)) == 20_000
    assert all(len(k) == 7 and set(k) <= set(BASE62_ALPHABET) for k in keys)


def test_prefix_and_suffix_are_part_of_every_key_and_checked() -> None:
    id_type = numeric(prefix="FAR-", suffix=".x")
    keys, _ = id_type.generate(0, 5_000)
    assert all(k.startswith("FAR-") and k.endswith(".x") and len(k) == 16 for k in keys)
    assert all(id_type.validate(k) for k in keys)
    core = keys[0][4:-2]
    assert not id_type.validate(core)  # affixes missing
    assert not id_type.validate("FAR-" + core)
    assert id_type.fingerprint.prefix == "FAR-"


def test_a_value_whose_affixes_overlap_names_no_key() -> None:
    """The prefix and suffix of "X-" (prefix "X-", suffix "-") share its "-": no core."""
    id_type = numeric(2, order="sequential", check_digit="none", prefix="X-", suffix="-")
    assert id_type.core("X-") is None and not id_type.validate("X-")
    assert id_type.normalise("X-") == "X-"  # looked up as sent: no key of the type
    assert id_type.normalise("X-07-") == "X-07-" and id_type.validate("X-07-")


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
    with pytest.raises(InvalidInput):
        numeric().validate("1" * 300)


def test_generation_needs_the_secret() -> None:
    id_type = IdType("farmer", IdTypeConfig(kind="numeric", length=10), None)
    assert id_type.validate("3029384756")
    with pytest.raises(ConfigError, match="permutation_key"):
        id_type.generate(0, 10)


def test_fingerprint_carries_the_key_digest_not_the_key() -> None:
    print_ = numeric().fingerprint.as_dict()
    assert print_["kind"] == "numeric" and print_["length"] == 10
    assert print_["permutation"].startswith("feistel")
    assert SECRET.decode() not in str(print_)
    other = IdType("farmer", IdTypeConfig(kind="numeric", length=10), b"other").fingerprint
    assert other.permutation_key_digest != print_["permutation_key_digest"]


def test_sequential_numeric_is_counter_order_zero_padded() -> None:
    plain = numeric(5, order="sequential", check_digit="none", prefix="FAR-")
    keys, tried = plain.generate(0, 3)
    assert (keys, tried) == (["FAR-00000", "FAR-00001", "FAR-00002"], 3)
    assert plain.validate("FAR-00042") and not plain.validate("FAR-0042")
    checked = numeric(6, order="sequential")
    keys, _ = checked.generate(41, 44)
    assert [k[:5] for k in keys] == ["00041", "00042", "00043"]
    assert all(verhoeff_valid(k) and checked.validate(k) for k in keys)


def test_sequential_types_keep_filters_when_asked() -> None:
    filtered = numeric(6, order="sequential", filter_profile="openg2p")
    keys, tried = filtered.generate(0, 100_000)
    assert tried == 100_000 and keys == sorted(keys)
    assert all(not rejected_by(k, filtered.rules) for k in keys)


def test_sequential_base62_sorts_as_bytes() -> None:
    short = IdType("s", IdTypeConfig(kind="base62", length=3, order="sequential"), SECRET)
    keys, _ = short.generate(0, 62 * 62 + 5)
    assert keys[:3] == ["000", "001", "002"] and keys == sorted(keys)


def test_sequential_fingerprint_names_the_identity_and_no_key() -> None:
    fingerprint = numeric(5, order="sequential", check_digit="none").fingerprint
    assert fingerprint.permutation == "identity"
    assert fingerprint.permutation_key_digest == ""
    assert fingerprint.check_digit == "none" and fingerprint.counter_domain == 100_000
    permuted = numeric(10).fingerprint
    assert permuted.permutation != "identity" and permuted.check_digit == "verhoeff"


def test_long_sequential_types_pad_past_the_counter_digits() -> None:
    keys, _ = numeric(25, order="sequential").generate(7, 8)
    assert keys[0][:24] == "0" * 23 + "7" and verhoeff_valid(keys[0])
