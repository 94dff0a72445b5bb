"""The drill's lifecycle checker on made-up histories: each check holds on a clean
history and names what a broken one did."""

from __future__ import annotations

from keydispenser_ops.drill.history import LossSpan
from keydispenser_ops.drill.lifecycle import (
    Change,
    Issue,
    LifecycleLoad,
    Pair,
    Receipt,
    Repeat,
    Retry,
    check,
)


def load(**history: list[object]) -> LifecycleLoad:
    found = LifecycleLoad(urls=[], keys={})
    for name, items in history.items():
        getattr(found, name).extend(items)
    return found


def test_a_key_given_back_then_issued_to_another_is_in_one_hand_at_a_time() -> None:
    history = load(
        receipts=[Receipt("K", "a", 1.0, "get"), Receipt("K", "b", 5.0, "get")],
        changes=[
            Change("K", "a", "UNASSIGNED", 2.0, True),
            Change("K", "b", "ASSIGNED", 6.0, True),
        ],
    )
    issues = {"K": [Issue("a", False, True), Issue("b", True, False)]}
    found = check(history, issues, [])
    assert found["keys_in_two_hands"] == 0 and found["status_changes_lost"] == 0
    assert found["ledger_wrong_client"] == 0 and found["ledger_missing"] == 0
    assert found["uins_reissued"] == 1


def test_a_key_handed_to_another_while_held_is_in_two_hands() -> None:
    history = load(receipts=[Receipt("K", "a", 1.0, "get"), Receipt("K", "b", 5.0, "get")])
    issues = {"K": [Issue("a", False, False), Issue("b", False, False)]}
    assert check(history, issues, [])["keys_in_two_hands"] == 1


def test_lost_changes_wrong_clients_and_missing_records_are_counted() -> None:
    history = load(
        receipts=[Receipt("K", "a", 1.0, "get"), Receipt("L", "a", 2.0, "post")],
        changes=[Change("K", "a", "ASSIGNED", 3.0, True)],
    )
    found = check(history, {"K": [Issue("b", False, False)]}, [])
    assert found["ledger_wrong_client"] == 1  # K: recorded under b
    assert found["ledger_missing"] == 1  # L: no record at all
    assert found["status_changes_lost"] == 1  # K's ASSIGNED under a is nowhere


def test_a_restart_that_destroys_records_excuses_only_its_own_span() -> None:
    history = load(receipts=[Receipt("K", "a", 10.0, "get"), Receipt("L", "a", 30.0, "get")])
    spans = [LossSpan("redis_restart_empty", 9.0, 12.0), LossSpan("primary_sigkill", 29.0, 31.0)]
    found = check(history, {}, spans)
    assert found["lost_to_fault"] == {"redis_restart_empty": 1}  # replicated: a kill excuses none
    assert found["ledger_missing"] == 1


def test_a_replay_of_a_key_given_back_and_issued_to_another_is_named() -> None:
    history = load(
        receipts=[Receipt("K", "a", 1.0, "post"), Receipt("K", "b", 5.0, "get")],
        changes=[Change("K", "a", "UNASSIGNED", 2.0, True)],
        retries=[
            Retry("a", "a-1", "K", "K", 3.0, True, 1.0),  # a split brain's replay: given back
            Retry("a", "a-1", "K", "K", 6.0, True, 1.0),  # ... after b got it: two hands
        ],
    )
    issues = {"K": [Issue("a", False, True), Issue("b", False, False)]}
    found = check(history, issues, [])
    assert found["replays_of_given_back_keys"] == 2
    assert found["replays_of_keys_reissued"] == 1


def test_a_receipt_a_restart_destroyed_is_lost_to_it_even_with_other_issues_of_its_key() -> None:
    history = load(receipts=[Receipt("K", "a", 10.0, "get"), Receipt("K", "b", 40.0, "get")])
    issues = {"K": [Issue("a", False, True)]}  # b's issue went with the restart
    spans = [LossSpan("redis_restart_old_snapshot", 39.0, 41.0)]
    found = check(history, issues, spans)
    assert found["ledger_wrong_client"] == 0
    assert found["lost_to_fault"] == {"redis_restart_old_snapshot": 1}
    assert check(history, issues, [])["ledger_wrong_client"] == 1  # no fault: wrong


def test_a_pair_decided_once_holds_and_a_pair_applied_both_ways_is_named() -> None:
    """PUT ASSIGNED and PUT UNASSIGNED of one UIN at once: one applied, the other
    refused (KER-UIG-004); both applied is what the ledger's one history forbids."""
    once = load(
        pairs=[Pair("K", "a", "ASSIGNED", "KER-UIG-004", 2.0)],
        changes=[
            Change("K", "a", "ASSIGNED", 2.0, True),
            Change("K", "a", "UNASSIGNED", 2.0, False),
        ],
    )
    found = check(once, {"K": [Issue("a", True, False)]}, [])
    assert found["put_pairs_decided"] == 1 and found["put_pairs_both_applied"] == 0
    both = load(pairs=[Pair("K", "a", "ASSIGNED", "UNASSIGNED", 2.0)])
    assert check(both, {"K": [Issue("a", True, False)]}, [])["put_pairs_both_applied"] == 1


def test_an_acknowledged_put_asked_again_is_answered_so_or_counted() -> None:
    """A repeat answered ASSIGNED holds; one answered KER-UIG-005 (the ledger behind
    while a failover lasts) decided nothing; one answered otherwise is a contradiction."""
    history = load(
        repeats=[
            Repeat("K", "a", "ASSIGNED", 1.0),
            Repeat("K", "a", "KER-UIG-005", 1.0),
            Repeat("K", "a", "KER-UIG-004", 1.0),
        ]
    )
    found = check(history, {"K": [Issue("a", True, False)]}, [])
    assert found["repeats"] == 3 and found["repeats_unanswered"] == 1
    assert found["repeats_contradicted"] == 1
