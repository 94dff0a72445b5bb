"""A site's share of a type's counters: validated, named in errors, and shares of one
split meet without gap or overlap."""

from __future__ import annotations

import itertools

import pytest

from shared.domain.config import IdTypeConfig, load_settings
from shared.domain.errors import ConfigError
from shared.domain.idtypes import IdType
from tests.conftest import EMPTY_CONFIG, TEST_SECRET


def tiny(site: dict[str, int]) -> dict[str, object]:
    return {"tiny": {"kind": "numeric", "length": 5, "site": site}}


@pytest.mark.parametrize(
    ("site", "message"),
    [
        ({"index": 2, "of": 2}, "index 2 must be below of"),
        ({"index": -1, "of": 2}, "index"),
        ({"index": 0, "of": 1}, "of"),
        ({"index": 0}, "of"),
        ({"index": 0, "of": 2, "offset": 5}, "offset"),
    ],
)
def test_a_bad_site_is_refused_naming_the_field(site: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"id_types\.tiny\.site.*{message}"):
        load_settings(EMPTY_CONFIG, permutation_key=TEST_SECRET, id_types=tiny(site))


@pytest.mark.parametrize("of", [32, 62, 100])
def test_a_share_holds_at_least_two_counters(of: int) -> None:
    """A sequence needs MINVALUE below MAXVALUE (62 // 32 is 1)."""
    types = {"one": {"kind": "base62", "length": 1, "site": {"index": 0, "of": of}}}
    with pytest.raises(ConfigError, match=rf"62 counters cannot be split {of} ways"):
        load_settings(EMPTY_CONFIG, permutation_key=TEST_SECRET, id_types=types)


@pytest.mark.parametrize("length", [1, 2, 3, 7])
@pytest.mark.parametrize("of", [2, 3, 7, 10, 31])
def test_shares_of_one_split_meet_without_gap_or_overlap(length: int, of: int) -> None:
    shares = [
        IdTypeConfig.model_validate(
            {"kind": "base62", "length": length, "site": {"index": i, "of": of}}
        )
        for i in range(of)
    ]
    assert shares[0].counter_start == 0 and shares[-1].counter_stop == 62**length
    for a, b in itertools.pairwise(shares):
        assert a.counter_stop == b.counter_start
    assert all(s.counter_share >= 62**length // of for s in shares)


def test_the_site_is_in_the_fingerprint_only_when_set() -> None:
    """A fingerprint recorded before sites existed still matches a type without one."""
    plain = IdType("t", IdTypeConfig(kind="base62", length=4), TEST_SECRET.encode())
    sited = IdType(
        "t",
        IdTypeConfig.model_validate({"kind": "base62", "length": 4, "site": {"index": 1, "of": 2}}),
        TEST_SECRET.encode(),
    )
    assert "site" not in plain.fingerprint.as_dict()
    assert sited.fingerprint.as_dict()["site"] == {"index": 1, "of": 2}
    without_site = {k: v for k, v in sited.fingerprint.as_dict().items() if k != "site"}
    assert without_site == plain.fingerprint.as_dict()
