"""How one type's marks of a ledger batch become statements (``table.in_stream_order``):
the first mark of a key wins whatever the batch's bounds."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.stores.ledger.batch import Used
from shared.stores.ledger.decide import in_stream_order

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def marks(*items: tuple[str, str]) -> Used:
    """(key, entry) pairs, marked by one client."""
    used = Used()
    for key, entry in items:
        used.keys.append(key)
        used.times.append(WHEN)
        used.clients.append("c1")
        used.admin.append(False)
        used.entries.append(entry)
    return used


def test_keys_marked_once_are_applied_in_bulk_uses_first() -> None:
    uses, releases = marks(("a", "5-0"), ("b", "6-0")), marks(("c", "1-0"))
    assert in_stream_order(uses, releases) == [("used", uses), ("release", releases)]
    assert in_stream_order(None, releases) == [("release", releases)]


def test_a_key_marked_twice_is_applied_mark_by_mark_in_stream_order() -> None:
    uses = marks(("a", "5-0"), ("k", "12-0"))
    releases = marks(("k", "9-3"), ("b", "7-0"))
    statements = in_stream_order(uses, releases)
    assert [(op, m.keys, m.entries) for op, m in statements] == [
        ("used", ["a"], ["5-0"]),
        ("release", ["b"], ["7-0"]),
        ("release", ["k"], ["9-3"]),  # first in the stream, though a release
        ("used", ["k"], ["12-0"]),
    ]


def test_entries_order_by_time_then_sequence_not_as_text() -> None:
    uses = marks(("k", "10-0"), ("k", "9-11"))
    statements = in_stream_order(uses, None)
    assert [m.entries for _, m in statements] == [["9-11"], ["10-0"]]
