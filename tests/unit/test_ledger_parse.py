"""Ledger stream entries -> rows: grouping, client lists, keys an entry lists twice."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.domain.config import IdTypeConfig, load_settings
from shared.domain.idtypes import build_id_types
from shared.stores.ledger.batch import entry_time, parse
from tests.conftest import EMPTY_CONFIG, TEST_SECRET


def types() -> dict:  # type: ignore[type-arg]
    settings = load_settings(
        EMPTY_CONFIG,
        permutation_key=TEST_SECRET,
        id_types={
            "link": {"kind": "base62", "length": 7, "ledger": True},
            "plain": {"kind": "base62", "length": 7},
        },
    )
    return build_id_types(settings, generating=False)


def test_entry_ids_carry_the_issue_time() -> None:
    assert entry_time("1764126000123-4") == datetime(2025, 11, 26, 3, 0, 0, 123000, UTC)


def test_issue_entries_stay_one_item_per_entry() -> None:
    batch = parse(
        [
            ("1-0", {"op": "issue", "type": "link", "keys": "a b", "clients": "x y", "idem": ""}),
            ("2-0", {"op": "issue", "type": "link", "keys": "c d", "clients": "z", "idem": "k1"}),
        ],
        types(),
    )
    rows = batch.issued["link"]  # PostgreSQL splits them (ledger_sql._ISSUE_BATCH)
    assert rows.keys == ["a b", "c d"] and rows.count == 4
    assert rows.clients == ["x y", "z"]
    assert rows.idempotency_keys == [None, "k1"]
    assert rows.entries == ["1-0", "2-0"]
    assert rows.issues() == ["1-0 a", "1-0 b", "2-0 c", "2-0 d"]
    assert not batch.duplicates


def test_a_key_one_entry_lists_twice_is_a_duplicate_two_entries_are_for_the_ledger() -> None:
    """A key twice in one entry is a duplicate at once; a key issued by two entries is
    left to the decision: the earlier may be a released issue applied again
    (decide._issue; test_ledger_record.py)."""
    batch = parse(
        [
            ("1-0", {"op": "issue", "type": "link", "keys": "a b", "clients": "-"}),
            ("2-0", {"op": "issue", "type": "link", "keys": "b c", "clients": "p q"}),
            ("3-0", {"op": "issue", "type": "link", "keys": "d d", "clients": "r s"}),
        ],
        types(),
    )
    rows = batch.issued["link"]
    assert rows.keys == ["a b", "b c", "d"] and rows.count == 5
    assert rows.clients == ["-", "p q", "r"]  # each kept key keeps its own client
    assert rows.issues() == ["1-0 a", "1-0 b", "2-0 b", "2-0 c", "3-0 d"]
    assert batch.duplicates == {"link": ["d"]}


def test_used_entries_and_entries_of_types_without_a_ledger() -> None:
    batch = parse(
        [
            ("5-0", {"op": "used", "type": "link", "keys": "a", "clients": "x"}),
            ("6-0", {"op": "issue", "type": "plain", "keys": "a", "clients": "x"}),
            ("7-0", {"op": "issue", "type": "gone", "keys": "a", "clients": "x"}),
        ],
        types(),
    )
    assert batch.used["link"].keys == ["a"]
    assert batch.skipped == 2
    assert "plain" not in batch.issued


def test_a_reissuing_types_idempotency_records_live_no_longer_than_a_release_waits() -> None:
    """A retry replayed by a Redis server that never saw the release (a split brain)
    may return a key given back, never one issued again since."""
    settings = load_settings(
        EMPTY_CONFIG,
        permutation_key=TEST_SECRET,
        id_types={
            "uin": {"kind": "numeric", "length": 10, "ledger": True, "reissue_released": True,
                    "reissue_after_s": 600},
            "fast": {"kind": "numeric", "length": 10, "ledger": True, "reissue_released": True,
                     "reissue_after_s": 0.5},
            "kept": {"kind": "numeric", "length": 10, "ledger": True},
        },
    )  # fmt: skip
    types = {name: c for name, c in settings.id_types.items() if isinstance(c, IdTypeConfig)}
    assert types["uin"].idempotency_ttl_s(86_400) == 600
    assert types["uin"].idempotency_ttl_s(60) == 60
    assert types["fast"].idempotency_ttl_s(86_400) == 1  # Redis's least
    assert types["kept"].idempotency_ttl_s(86_400) == 86_400  # never issued again
