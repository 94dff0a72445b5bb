"""Ledger stream entries -> rows: grouping, client lists, in-batch duplicates."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.domain.config import load_settings
from shared.domain.idtypes import build_id_types
from shared.stores.ledger import entry_time, parse
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
    rows = batch.issued["link"]  # PostgreSQL splits them (sql._ISSUE_BATCH)
    assert rows.keys == ["a b", "c d"] and rows.count == 4
    assert rows.clients == ["x y", "z"]
    assert rows.idempotency_keys == [None, "k1"]
    assert rows.entries == ["1-0", "2-0"]
    assert rows.all_keys() == ["a", "b", "c", "d"]
    assert not batch.duplicates


def test_a_key_issued_twice_within_a_batch_is_a_duplicate() -> None:
    batch = parse(
        [
            ("1-0", {"op": "issue", "type": "link", "keys": "a b", "clients": "-"}),
            ("2-0", {"op": "issue", "type": "link", "keys": "b c", "clients": "p q"}),
            ("3-0", {"op": "issue", "type": "link", "keys": "d d", "clients": "r"}),
        ],
        types(),
    )
    rows = batch.issued["link"]
    assert rows.keys == ["a b", "c", "d"] and rows.count == 4
    assert rows.clients == ["-", "q", "r"]  # each kept key keeps its own client
    assert batch.duplicates == {"link": ["b", "d"]}


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
