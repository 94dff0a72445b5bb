"""Keyspace headroom and its forecast (invariant exhaustion-foreseen, docs/design.md)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Headroom:
    counters_left: int
    fraction_left: float
    estimated_keys_left: int | None  # counters left x measured acceptance rate
    eta_s: float | None  # at the leasing rate seen recently; None while unknown
    crossed: tuple[float, ...]  # warning thresholds newly crossed by this observation


class HeadroomWatch:
    """Follows one type's sequence; reports each warning threshold once."""

    def __init__(self, domain: int, thresholds: tuple[float, ...], window: int = 32) -> None:
        self._domain = domain
        self._thresholds = sorted(thresholds, reverse=True)
        self._samples: deque[tuple[float, int]] = deque(maxlen=window)
        self._warned: set[float] = set()

    def observe(
        self, now: float, leased: int, acceptance: float | None, excluded: int = 0
    ) -> Headroom:
        """``leased``: counters leased so far; ``excluded``: counters not leased yet whose
        keys an import excluded (never handed out: not headroom)."""
        # A sample per change of the sequence (a lease by any process, a fence moving it
        # on): looking again while nothing was leased does not shorten the forecast's
        # window.
        if not self._samples or self._samples[-1][1] != leased:
            self._samples.append((now, leased))
        left = max(self._domain - leased - excluded, 0)
        fraction = left / self._domain
        crossed = tuple(t for t in self._thresholds if fraction < t and t not in self._warned)
        self._warned.update(crossed)
        keys_left = None if acceptance is None else int(left * acceptance)
        return Headroom(left, fraction, keys_left, self._eta(left), crossed)

    def _eta(self, left: int) -> float | None:
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        if t1 <= t0 or last <= first:
            return None
        return left / ((last - first) / (t1 - t0))
