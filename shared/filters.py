"""The ten ID filters of OpenG2P's ID Generator, as a scalar reference.

``s`` is the whole ID including its check digit. Each function returns True
when the value must be REJECTED. ``vfilters`` holds the vectorised twin used by
key generation; tests keep the two in exact agreement.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.settings import FilterLimits

CYCLIC_NUMBERS: tuple[str, ...] = (
    "142857",
    "0588235294117647",
    "052631578947368421",
    "0434782608695652173913",
    "0344827586206896551724137931",
    "0212765957446808510638297872340425531914893617",
    "0169491525423728813559322033898305084745762711864406779661",
    "016393442622950819672131147540983606557377049180327868852459",
    "010309278350515463917525773195876288659793814432989690721649484536082474226804123711340206185567",
)
EVEN_DIGITS = frozenset("02468")


def rejects_length(s: str, length: int) -> bool:
    return len(s) != length


def rejects_not_start_with(s: str, prefixes: tuple[str, ...]) -> bool:
    return bool(s) and s[0] in prefixes


def rejects_sequence(s: str, limit: int) -> bool:
    for i in range(len(s) - limit + 1):
        steps = [int(s[i + k + 1]) - int(s[i + k]) for k in range(limit - 1)]
        if all(step == 1 for step in steps) or all(step == -1 for step in steps):
            return True
    return False


def rejects_repeating_digit(s: str, limit: int) -> bool:
    return any(s[i] == s[i + d] for d in range(1, limit) for i in range(len(s) - d))


def rejects_repeating_block(s: str, limit: int) -> bool:
    return any(s[i : i + limit] in s[i + limit :] for i in range(len(s) - limit))


def rejects_conjugative_even(s: str, limit: int) -> bool:
    run = 0
    for ch in s:
        run = run + 1 if ch in EVEN_DIGITS else 0
        if run >= limit:
            return True
    return False


def rejects_first_equals_last(s: str, limit: int) -> bool:
    return len(s) >= 2 * limit and s[:limit] == s[-limit:]


def rejects_first_equals_reverse(s: str, limit: int) -> bool:
    return len(s) >= 2 * limit and s[:limit] == s[-limit:][::-1]


def rejects_restricted(s: str, restricted: tuple[str, ...]) -> bool:
    return any(entry and entry in s for entry in restricted)


def rejects_cyclic(s: str) -> bool:
    return any(number in s for number in CYCLIC_NUMBERS)


def openg2p_rules(length: int, limits: FilterLimits) -> list[tuple[str, Callable[[str], bool]]]:
    """The ten filters in OpenG2P's order, bound to their limits."""
    return [
        ("length", lambda s: rejects_length(s, length)),
        ("not_start_with", lambda s: rejects_not_start_with(s, limits.not_start_with)),
        ("sequence", lambda s: rejects_sequence(s, limits.sequence)),
        ("repeating_digit", lambda s: rejects_repeating_digit(s, limits.repeating_digit)),
        ("repeating_block", lambda s: rejects_repeating_block(s, limits.repeating_block)),
        ("conjugative_even", lambda s: rejects_conjugative_even(s, limits.conjugative_even)),
        ("first_equals_last", lambda s: rejects_first_equals_last(s, limits.first_equals_last)),
        (
            "first_equals_reverse",
            lambda s: rejects_first_equals_reverse(s, limits.first_equals_reverse),
        ),
        ("restricted_numbers", lambda s: rejects_restricted(s, limits.restricted_numbers)),
        ("cyclic_numbers", rejects_cyclic),
    ]


def rejected_by(s: str, length: int, limits: FilterLimits) -> list[str]:
    """Names of every filter that rejects ``s`` (empty: ``s`` passes)."""
    return [name for name, rule in openg2p_rules(length, limits) if rule(s)]
