"""The ID formats: the registry agrees with the configuration's ``kind`` literal, every
format keeps the promises of its interface, and each kind's fingerprint and keys are
pinned (a changed fingerprint makes existing deployments refuse to start)."""

from __future__ import annotations

import re
from typing import Any, get_args

import pytest

from dispenser.openapi import KEY_PATTERN
from dispenser.openg2p import global_rules_type
from shared.domain.config import IdTypeConfig, SnowflakeConfig
from shared.domain.config.id_types import ID_KINDS
from shared.domain.errors import InvalidInput
from shared.domain.formats import FORMATS, PooledKind, read_characters
from shared.domain.idtypes import MAX_INPUT, IdType
from shared.domain.names import AFFIX

SECRET = b"unit-secret"
KINDS = sorted(FORMATS)


def pooled(kind: str, **settings: Any) -> IdTypeConfig:
    return IdTypeConfig.model_validate({"kind": kind, **settings})


def make(kind: str, name: str = "farmer", **extra: Any) -> IdType:
    return IdType(name, pooled(kind, **extra), SECRET)


def test_every_kind_literal_has_a_format_and_every_format_a_literal() -> None:
    assert set(get_args(PooledKind)) == set(FORMATS)
    assert all(FORMATS[kind].kind == kind for kind in FORMATS)
    (snowflake,) = get_args(SnowflakeConfig.model_fields["kind"].annotation)
    assert set(ID_KINDS) == {*FORMATS, snowflake}


@pytest.mark.parametrize("kind", KINDS)
def test_a_formats_length_limits_are_the_configurations(kind: str) -> None:
    lo, hi = FORMATS[kind].length_limits
    for length in (lo, hi):
        assert pooled(kind, length=length).length == length
    for length in (lo - 1, hi + 1):
        with pytest.raises(ValueError, match=f"length {length} out of range for kind {kind}"):
            pooled(kind, length=length)


@pytest.mark.parametrize("kind", KINDS)
def test_a_formats_keys_validate_and_use_its_alphabet(kind: str) -> None:
    id_type = make(kind, length=8, prefix="X-")
    keys, candidates = id_type.generate(0, 20_000)
    assert candidates == 20_000 and 0 < len(keys) == len(set(keys))
    assert all(id_type.validate(k) for k in keys)
    form = FORMATS[kind]
    assert set("".join(k[2:] for k in keys)) <= set(form.key_characters)
    assert set(form.alphabet) <= set(form.key_characters) <= set(form.read_characters)
    assert all(id_type.normalise(k) == k for k in keys)  # as the stores hold them
    assert not id_type.validate(keys[0][2:])  # affix missing
    with pytest.raises(InvalidInput, match=f"the {kind} alphabet"):
        id_type.validate("X-" + "!" * 8)


@pytest.mark.parametrize("kind", KINDS)
def test_a_formats_domain_is_the_types(kind: str) -> None:
    length = FORMATS[kind].length_limits[0] + 1
    config = pooled(kind, length=length)
    assert config.domain_size == FORMATS[kind].domain_size(config)
    assert make(kind, length=length).generate(0, 10**6)[1] == config.domain_size


@pytest.mark.parametrize("kind", KINDS)
def test_a_formats_check_schemes_are_the_configurations(kind: str) -> None:
    """Its first is the default; any other value is refused, naming the field, the kind
    and the schemes it takes."""
    schemes = FORMATS[kind].check_schemes
    assert pooled(kind, length=5).check_digit == schemes[0]
    for scheme in schemes:
        settings = {"order": "sequential"} if scheme == "none" else {}
        assert pooled(kind, length=5, check_digit=scheme, **settings).check_digit == scheme
    for other in {"verhoeff", "none", "luhn"} - set(schemes):
        with pytest.raises(ValueError, match=f"check_digit: '{other}' is not a check scheme "):
            pooled(kind, length=5, check_digit=other)


def test_a_formats_defaults_apply_unless_given() -> None:
    assert IdTypeConfig(kind="base62", length=5).check_digit == "none"
    assert IdTypeConfig(kind="numeric", length=5).check_digit == "verhoeff"
    with pytest.raises(
        ValueError, match=r"'verhoeff' is not a check scheme of kind base62 \(none\)"
    ):
        IdTypeConfig(kind="base62", length=5, check_digit="verhoeff")


def test_the_apis_key_pattern_admits_what_the_formats_read_and_the_affixes() -> None:
    """The pattern comes from the formats: a format's own characters (a check symbol, a
    spelling it reads) are admitted without naming them in the API."""
    pattern = re.compile(KEY_PATTERN)
    printable = {chr(c) for c in range(33, 127)}
    affixes = {c for c in printable if AFFIX.fullmatch(c)}
    assert {c for c in printable if pattern.fullmatch(c)} == affixes | read_characters()
    for kind in KINDS:
        assert pattern.fullmatch(FORMATS[kind].read_characters)
        keys, _ = make(kind, length=8, prefix="FAR-", suffix=".x").generate(0, 100)
        assert keys and all(pattern.fullmatch(key) for key in keys)
    assert pattern.fullmatch("7" * MAX_INPUT) and not pattern.fullmatch("7" * (MAX_INPUT + 1))
    assert not pattern.fullmatch("7/8") and not pattern.fullmatch("")


def test_openg2ps_global_rules_describe_a_filtered_type() -> None:
    base62 = make("base62", "shortlink", length=7)
    mosip = make("numeric", "uin", length=10, filter_profile="mosip")
    openg2p = make("numeric", "farmer", length=10)
    assert global_rules_type({"s": base62, "u": mosip, "f": openg2p}) is openg2p
    assert global_rules_type({"s": base62, "u": mosip}) is mosip
    assert global_rules_type({"s": base62}) is base62
    assert global_rules_type({}) is None


DIGEST = "a29caaf202707a56481234d07a344467"  # of the key derived from SECRET for "farmer"
BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CROCKFORD32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
COMMON = {"prefix": "", "suffix": "", "range_size": 1_048_576}
PERMUTED = {"permutation": "feistel-fmix32-8r-v1", "permutation_key_digest": DIGEST}
IDENTITY = {"permutation": "identity", "permutation_key_digest": ""}
PINNED: dict[str, tuple[dict[str, Any], dict[str, Any], list[str]]] = {
    "numeric": (
        {"kind": "numeric", "length": 10},
        {"alphabet": "0123456789", "check_digit": "verhoeff", "counter_domain": 10**9} | PERMUTED,
        ["2712534219", "6303841421", "2537315698"],
    ),
    "numeric_sequential": (
        {"kind": "numeric", "length": 5, "order": "sequential", "check_digit": "none"}
        | {"prefix": "FAR-"},
        {"alphabet": "0123456789", "check_digit": "none", "counter_domain": 100_000}
        | IDENTITY
        | {"prefix": "FAR-"},
        ["FAR-01000", "FAR-01001", "FAR-01002"],
    ),
    "numeric_long": (
        {"kind": "numeric", "length": 20, "filter_profile": "mosip", "suffix": "-x"},
        {"alphabet": "0123456789", "check_digit": "verhoeff", "counter_domain": 10**18}
        | PERMUTED
        | {"suffix": "-x"},
        ["80673205213794034965-x"],
    ),
    "base62": (
        {"kind": "base62", "length": 7},
        {"alphabet": BASE62, "check_digit": "none", "counter_domain": 62**7} | PERMUTED,
        ["80IJw5d", "wdbJpUd", "ezbWaKp"],
    ),
    "base62_site": (
        {"kind": "base62", "length": 4, "order": "sequential", "site": {"index": 1, "of": 2}},
        {"alphabet": BASE62, "check_digit": "none", "counter_domain": 62**4}
        | IDENTITY
        | {"site": {"index": 1, "of": 2}},
        ["00G8", "00G9", "00GA"],
    ),
    "crockford32": (
        {"kind": "crockford32", "length": 9},
        {"alphabet": CROCKFORD32, "check_digit": "mod37", "counter_domain": 32**8} | PERMUTED,
        ["XENPAGMM~", "F70ZDSDZJ", "EMWBMDY1A"],
    ),
    "crockford32_sequential": (
        {"kind": "crockford32", "length": 6, "order": "sequential", "prefix": "TK-"},
        {"alphabet": CROCKFORD32, "check_digit": "mod37", "counter_domain": 32**5}
        | IDENTITY
        | {"prefix": "TK-"},
        ["TK-000Z81", "TK-000Z92", "TK-000ZA3"],
    ),
    "crockford32_unchecked": (
        {"kind": "crockford32", "length": 12, "check_digit": "none"},
        {"alphabet": CROCKFORD32, "check_digit": "none", "counter_domain": 32**12} | PERMUTED,
        ["FMT0H2XGX4TE", "2T9W5JGQQTPC", "VCRAJ84GNJBV"],
    ),
}


@pytest.mark.parametrize("case", sorted(PINNED))
def test_each_kinds_fingerprint_and_keys_are_pinned(case: str) -> None:
    """Byte for byte what deployments stored: change nothing here without a migration."""
    settings, fingerprint, first_keys = PINNED[case]
    id_type = IdType("farmer", IdTypeConfig.model_validate(settings), SECRET)
    shape = {k: settings[k] for k in ("kind", "length")}
    assert id_type.fingerprint.as_dict() == COMMON | shape | fingerprint
    assert id_type.generate(1000, 1040)[0][:3] == first_keys
