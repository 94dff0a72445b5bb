"""The ID filters of OpenG2P's ID Generator and MOSIP's UIN generator: the scalar
reference, written to follow each original's definition literally.

``s`` is the whole ID including its check digit (without prefix/suffix). A rule
returns True when the value must be REJECTED. ``shared.domain.vfilters`` is the
vectorised twin used by key generation; tests keep the two in exact agreement.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from shared.domain.config import FilterLimits

Profile = Literal["openg2p", "mosip", "none"]

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
MOSIP_SEQ_ASC = "01234567890123456789"
MOSIP_SEQ_DESC = "98765432109876543210"
MOSIP_RESTRICTED_DEFAULT = ("786", "666")


@dataclass(frozen=True)
class Rules:
    """Filter limits of one ID type, resolved for its profile."""

    profile: Profile
    length: int
    not_start_with: tuple[str, ...]
    sequence: int
    repeating_digit: int
    repeating_block: int
    conjugative_even: int
    first_equals_last: int
    first_equals_reverse: int
    restricted: tuple[str, ...]

    @classmethod
    def resolve(cls, profile: Profile, length: int, limits: FilterLimits) -> Rules:
        restricted = limits.restricted_numbers
        if restricted is None:
            restricted = MOSIP_RESTRICTED_DEFAULT if profile == "mosip" else ()
        return cls(
            profile=profile,
            length=length,
            # An empty entry would match every ID; both originals are configured
            # from comma-separated lists, where it is a typo, so it is ignored.
            not_start_with=tuple(p for p in limits.not_start_with if p),
            sequence=limits.sequence,
            repeating_digit=limits.repeating_digit,
            repeating_block=limits.repeating_block,
            conjugative_even=limits.conjugative_even,
            first_equals_last=limits.first_equals_last,
            first_equals_reverse=limits.first_equals_reverse,
            restricted=tuple(r for r in restricted if r),
        )

    @property
    def banned_first_digits(self) -> tuple[int, ...]:
        """The single-digit ``not_start_with`` entries: digits no ID may start with.

        Both profiles reject them, and a first digit is the cheapest thing to test, so
        the vectorised filters check these before anything else; longer MOSIP prefixes
        are matched whole elsewhere.
        """
        if self.profile == "none":
            return ()
        return tuple(int(p) for p in self.not_start_with if len(p) == 1 and p.isdigit())


# --- OpenG2P -----------------------------------------------------------------


def openg2p_sequence(s: str, limit: int) -> bool:
    """``limit`` consecutive digits each +1 (or each -1) from the last; no wrap."""
    for i in range(len(s) - limit + 1):
        steps = [int(s[i + k + 1]) - int(s[i + k]) for k in range(limit - 1)]
        if all(step == 1 for step in steps) or all(step == -1 for step in steps):
            return True
    return False


def openg2p_repeating_digit(s: str, limit: int) -> bool:
    """A digit again at distance 1..limit-1."""
    return any(s[i] == s[i + d] for d in range(1, limit) for i in range(len(s) - d))


def repeating_block(s: str, limit: int) -> bool:
    """A block of ``limit`` digits occurring again later, not overlapping."""
    return any(s[i : i + limit] in s[i + limit :] for i in range(len(s) - limit))


def openg2p_conjugative_even(s: str, limit: int) -> bool:
    return re.search(f"[02468]{{{limit}}}", s) is not None


def _openg2p_rules(r: Rules) -> list[tuple[str, Callable[[str], bool]]]:
    wide = 2 * r.first_equals_last
    wide_rev = 2 * r.first_equals_reverse
    return [
        ("length", lambda s: len(s) != r.length),
        ("not_start_with", lambda s: bool(s) and s[0] in r.not_start_with),
        ("sequence", lambda s: openg2p_sequence(s, r.sequence)),
        ("repeating_digit", lambda s: openg2p_repeating_digit(s, r.repeating_digit)),
        ("repeating_block", lambda s: repeating_block(s, r.repeating_block)),
        ("conjugative_even", lambda s: openg2p_conjugative_even(s, r.conjugative_even)),
        (
            "first_equals_last",
            lambda s: len(s) >= wide and s[: r.first_equals_last] == s[-r.first_equals_last :],
        ),
        (
            "first_equals_reverse",
            lambda s: (
                len(s) >= wide_rev
                and s[: r.first_equals_reverse] == s[-r.first_equals_reverse :][::-1]
            ),
        ),
        ("restricted_numbers", lambda s: any(entry in s for entry in r.restricted)),
        ("cyclic_numbers", lambda s: any(number in s for number in CYCLIC_NUMBERS)),
    ]


# --- MOSIP (UinFilterUtil) -----------------------------------------------------


def mosip_sequence(s: str, limit: int) -> bool:
    """Any ``limit``-digit window found in 0123456789012... or 9876543210987..."""
    windows = (s[i : i + limit] for i in range(len(s) - limit + 1))
    return any(w in MOSIP_SEQ_ASC or w in MOSIP_SEQ_DESC for w in windows)


def _mosip_rules(r: Rules) -> list[tuple[str, Callable[[str], bool]]]:
    repeating = re.compile(rf"(\d)\d{{0,{r.repeating_digit - 1}}}\1")
    block = re.compile(rf"(\d{{{r.repeating_block},}}).*?\1")
    even = re.compile(f"[2468]{{{r.conjugative_even}}}")
    last, rev = r.first_equals_last, r.first_equals_reverse
    return [
        ("sequence", lambda s: mosip_sequence(s, r.sequence)),
        ("repeating_digit", lambda s: repeating.search(s) is not None),
        ("repeating_block", lambda s: block.search(s) is not None),
        ("conjugative_even", lambda s: even.search(s) is not None),
        ("first_equals_last", lambda s: s[:last] == s[len(s) - last :]),
        ("first_equals_reverse", lambda s: s[:rev] == s[len(s) - rev :][::-1]),
        ("restricted_numbers", lambda s: any(entry in s for entry in r.restricted)),
        ("not_start_with", lambda s: any(s.startswith(p) for p in r.not_start_with)),
        ("length", lambda s: len(s) != r.length),
        ("cyclic_numbers", lambda s: any(number in s for number in CYCLIC_NUMBERS)),
    ]


def rules_for(r: Rules) -> list[tuple[str, Callable[[str], bool]]]:
    """The filters of the profile, in the original's order, bound to their limits."""
    if r.profile == "openg2p":
        return _openg2p_rules(r)
    if r.profile == "mosip":
        return _mosip_rules(r)
    return [("length", lambda s: len(s) != r.length)]


def rejected_by(s: str, rules: Rules) -> list[str]:
    """Names of every filter that rejects ``s`` (empty: ``s`` passes)."""
    return [name for name, rule in rules_for(rules) if rule(s)]
