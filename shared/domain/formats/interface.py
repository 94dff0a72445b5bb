"""What a format answers: for the configuration (the class), and for one type (an
instance bound to its settings, filter rules and permutation key)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from shared.domain.arrays import U64, Cols
    from shared.domain.config import IdTypeConfig
    from shared.domain.filters import Rules


class Format(ABC):
    """One kind of pooled key: its text, its keyspace, what makes a text one of its keys.

    ``columns`` encodes a whole block of counter values at once (numpy columns), and
    ``valid`` is one cheap call per request: no per-key Python on the generation path.
    """

    kind: ClassVar[str]  # the configuration's ``kind:`` value
    alphabet: ClassVar[str]  # every character a key's core may hold (in the fingerprint)
    length_limits: ClassVar[tuple[int, int]]  # the settable lengths, both ends included
    defaults: ClassVar[Mapping[str, str]] = {}  # settings whose default differs here
    filtered: ClassVar[bool]  # its keys go through the type's filter profile

    @classmethod
    @abstractmethod
    def check(cls, config: IdTypeConfig) -> None:
        """Raise ValueError for a setting this format cannot honour (the length is
        checked against ``length_limits`` before)."""

    @classmethod
    @abstractmethod
    def domain_size(cls, config: IdTypeConfig) -> int:
        """Number of counters of a type: its keyspace before filters."""

    def __init__(self, config: IdTypeConfig, rules: Rules, key: bytes | None) -> None:
        """``key``: the type's permutation key; None where keys are only validated."""
        self.config = config
        self.rules = rules

    @abstractmethod
    def columns(self, values: U64) -> Cols:
        """ASCII codes of the cores of the keys that ``values`` (permuted counters, or
        plain ones for a sequential type) make, one column per accepted key, in order."""

    @abstractmethod
    def valid(self, core: str) -> bool:
        """True when ``core`` (affixes stripped, alphabet and length checked) is a key."""
